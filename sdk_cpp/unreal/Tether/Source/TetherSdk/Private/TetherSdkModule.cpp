// The TetherSdk module holds the SDK's plain C++ sources (Private/Sdk/, copied by
// sdk_cpp/unreal/vendor_sdk.sh); this file only registers the module.
#include "Modules/ModuleManager.h"

IMPLEMENT_MODULE(FDefaultModuleImpl, TetherSdk)
