// The Unreal side of Tether: an actor component and an NNE inference backend over the
// engine-independent SDK (module TetherSdk).
using UnrealBuildTool;

public class Tether : ModuleRules
{
	public Tether(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.UseExplicitOrSharedPCHs;
		bEnableExceptions = false;
		bUseRTTI = false;

		PublicDependencyModuleNames.AddRange(new string[] { "Core", "CoreUObject", "Engine", "TetherSdk" });
		PrivateDependencyModuleNames.AddRange(new string[] { "NNE" });
	}
}
