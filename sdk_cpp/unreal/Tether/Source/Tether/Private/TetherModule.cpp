// Registers the Tether module (the component and the NNE backend).
#include "Modules/ModuleManager.h"

IMPLEMENT_MODULE(FDefaultModuleImpl, Tether)
