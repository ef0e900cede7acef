// The engine-independent Tether C++ SDK (sdk_cpp/src and sdk_cpp/include), compiled
// as plain C++17 without exceptions or RTTI. sdk_cpp/unreal/vendor_sdk.sh copies the
// SDK's sources and nlohmann/json's header into this module (Public/, Private/Sdk/).
using System.IO;
using UnrealBuildTool;

public class TetherSdk : ModuleRules
{
	public TetherSdk(ReadOnlyTargetRules Target) : base(Target)
	{
		Type = ModuleType.CPlusPlus;
		// The SDK's files include no engine header: no shared PCH forced into them,
		// and each stays its own translation unit (they have file-local helpers).
		PCHUsage = PCHUsageMode.NoPCHs;
		bUseUnity = false;
		bEnableExceptions = false;
		bUseRTTI = false;
		CppStandard = CppStandardVersion.Cpp17;

		PublicIncludePaths.Add(Path.Combine(ModuleDirectory, "Public"));
		PrivateIncludePaths.Add(Path.Combine(ModuleDirectory, "Private", "Sdk"));
		// nlohmann/json aborts instead of throwing; the SDK checks every value it reads.
		PublicDefinitions.Add("JSON_NOEXCEPTION=1");
		PublicDefinitions.Add("TETHER_NO_EXCEPTIONS=1");

		PrivateDependencyModuleNames.Add("Core");  // the module boilerplate only
		if (Target.Platform == UnrealTargetPlatform.Win64)
		{
			PublicSystemLibraries.Add("ws2_32.lib");
		}
	}
}
