"""Writes the .meta file Unity needs beside every file and folder of the
package (an immutable package's assets without one are ignored), with a GUID
derived from the asset's path so that running it again changes nothing.

    python sdk_csharp/scripts/write_meta.py          # write missing .meta files, remove orphaned ones
    python sdk_csharp/scripts/write_meta.py --check  # exit 1 listing what is missing or orphaned

Unity skips folders ending in "~" (Documentation~, Samples~, Bench~) and
hidden ones; build/ is the local build output.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
SKIPPED = {"build", ".build"}

FOLDER = """fileFormatVersion: 2
guid: {guid}
folderAsset: yes
DefaultImporter:
  externalObjects: {{}}
  userData: 
  assetBundleName: 
  assetBundleVariant: 
"""
SCRIPT = """fileFormatVersion: 2
guid: {guid}
MonoImporter:
  externalObjects: {{}}
  serializedVersion: 2
  defaultReferences: []
  executionOrder: 0
  icon: {{instanceID: 0}}
  userData: 
  assetBundleName: 
  assetBundleVariant: 
"""
ASSEMBLY = """fileFormatVersion: 2
guid: {guid}
AssemblyDefinitionImporter:
  externalObjects: {{}}
  userData: 
  assetBundleName: 
  assetBundleVariant: 
"""
MANIFEST = """fileFormatVersion: 2
guid: {guid}
PackageManifestImporter:
  externalObjects: {{}}
  userData: 
  assetBundleName: 
  assetBundleVariant: 
"""
TEXT = """fileFormatVersion: 2
guid: {guid}
TextScriptImporter:
  externalObjects: {{}}
  userData: 
  assetBundleName: 
  assetBundleVariant: 
"""
OTHER = """fileFormatVersion: 2
guid: {guid}
DefaultImporter:
  externalObjects: {{}}
  userData: 
  assetBundleName: 
  assetBundleVariant: 
"""


def assets(root: Path = PACKAGE) -> list[Path]:
    """Every file and folder of the package Unity imports, in a stable order."""
    found: list[Path] = []
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or path.name.endswith("~") or path.suffix == ".meta":
            continue
        if root == PACKAGE and path.name in SKIPPED:
            continue
        found.append(path)
        if path.is_dir():
            found.extend(assets(path))
    return found


def guid_for(path: Path) -> str:
    return hashlib.md5(("com.tether.sdk/" + path.relative_to(PACKAGE).as_posix()).encode()).hexdigest()


def meta_text(path: Path) -> str:
    if path.is_dir():
        template = FOLDER
    elif path.suffix == ".cs":
        template = SCRIPT
    elif path.suffix == ".asmdef":
        template = ASSEMBLY
    elif path.name == "package.json":
        template = MANIFEST
    elif path.suffix in {".md", ".json", ".txt"}:
        template = TEXT
    else:
        template = OTHER
    return template.format(guid=guid_for(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if anything is missing or orphaned")
    args = parser.parse_args(argv)
    wanted = {path.with_name(path.name + ".meta"): path for path in assets()}
    problems: list[str] = []
    for meta, asset in wanted.items():
        if not meta.exists():
            problems.append(f"missing {meta.relative_to(PACKAGE)}")
            if not args.check:
                meta.write_text(meta_text(asset))
    for meta in PACKAGE.rglob("*.meta"):
        if meta not in wanted and not any(part.endswith("~") or part in SKIPPED for part in meta.relative_to(PACKAGE).parts):
            problems.append(f"orphaned {meta.relative_to(PACKAGE)}")
            if not args.check:
                meta.unlink()
    for problem in problems:
        print(problem)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
