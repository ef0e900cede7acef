// FTetherNNEBackend: only adapts types between the SDK's InferenceBackend and
// NNE; every check that has logic (sizes, statuses) is the SDK's contract.
#include "TetherNNEBackend.h"

#include "NNE.h"
#include "UObject/GarbageCollection.h"
#include "UObject/Package.h"

namespace
{
tether::Status Failed(const FString& What)
{
	return tether::Status(tether::ErrorCode::kInferenceFailed, TCHAR_TO_UTF8(*What));
}

// The last dimension of a model's input or output (0 when it is variable).
std::size_t LastDimension(const UE::NNE::FTensorDesc& Desc)
{
	const TConstArrayView<int32> Shape = Desc.GetShape().GetData();
	return Shape.Num() > 0 && Shape.Last() > 0 ? static_cast<std::size_t>(Shape.Last()) : 0;
}

// The index of the tensor named Name (ONNX names are case-sensitive), or INDEX_NONE;
// Names lists them all for a message.
int32 FindTensor(TConstArrayView<UE::NNE::FTensorDesc> Descs, const FString& Name, FString& Names)
{
	int32 Found = INDEX_NONE;
	for (int32 Index = 0; Index < Descs.Num(); ++Index)
	{
		if (Found == INDEX_NONE && Descs[Index].GetName().Equals(Name, ESearchCase::CaseSensitive))
		{
			Found = Index;
		}
		Names += FString::Printf(TEXT("%s'%s'"), Names.IsEmpty() ? TEXT("") : TEXT(", "), *Descs[Index].GetName());
	}
	return Found;
}

// Releases a model's UObject with garbage collection kept out, as load() creates it:
// this may run on the client's I/O thread (a retired model is destroyed there).
void ReleaseModelData(TStrongObjectPtr<UNNEModelData>& Data)
{
	if (Data.IsValid())
	{
		FGCScopeGuard GCGuard;
		Data.Reset();
	}
}
}  // namespace

FTetherNNEBackend::FTetherNNEBackend(const FString& InRuntimeName) : RuntimeName(InRuntimeName)
{
}

FTetherNNEBackend::~FTetherNNEBackend()
{
	ModelInstance.Reset();
	Model.Reset();
	ReleaseModelData(ModelData);
}

tether::Status FTetherNNEBackend::load(const std::uint8_t* model, std::size_t size, const std::string& input_name,
                                       const std::string& output_name)
{
	TWeakInterfacePtr<INNERuntimeCPU> Runtime = UE::NNE::GetRuntime<INNERuntimeCPU>(RuntimeName);
	if (!Runtime.IsValid())
	{
		return Failed(FString::Printf(TEXT("NNE runtime '%s' is not available (enable the NNERuntimeORT plugin)"),
		                              *RuntimeName));
	}
	TStrongObjectPtr<UNNEModelData> NewData;
	{
		// load() runs on the client's I/O thread: keep garbage collection out while the
		// UObject is created and rooted by the strong pointer.
		FGCScopeGuard GCGuard;
		NewData = TStrongObjectPtr<UNNEModelData>(NewObject<UNNEModelData>(GetTransientPackage()));
	}
	NewData->Init(TEXT("onnx"), TConstArrayView<uint8>(model, static_cast<int32>(size)));
	if (Runtime->CanCreateModelCPU(NewData.Get()) != INNERuntimeCPU::ECanCreateModelCPUStatus::Ok)
	{
		ReleaseModelData(NewData);
		return Failed(FString::Printf(TEXT("NNE runtime '%s' cannot create a model from these %llu bytes"),
		                              *RuntimeName, static_cast<unsigned long long>(size)));
	}
	TSharedPtr<UE::NNE::IModelCPU> NewModel = Runtime->CreateModelCPU(NewData.Get());
	TSharedPtr<UE::NNE::IModelInstanceCPU> NewInstance = NewModel.IsValid() ? NewModel->CreateModelInstanceCPU() : nullptr;
	if (!NewInstance.IsValid())
	{
		NewModel.Reset();
		ReleaseModelData(NewData);
		return Failed(FString::Printf(TEXT("NNE runtime '%s' failed to create the model"), *RuntimeName));
	}
	// The tensors by the names the server gives: NNE needs a binding for every input, so the
	// named one must be the only input; any other output is left unbound (the runtime fills its own).
	const TConstArrayView<UE::NNE::FTensorDesc> Inputs = NewInstance->GetInputTensorDescs();
	const TConstArrayView<UE::NNE::FTensorDesc> Outputs = NewInstance->GetOutputTensorDescs();
	FString InputNames;
	FString OutputNames;
	const int32 InputIndex = FindTensor(Inputs, UTF8_TO_TCHAR(input_name.c_str()), InputNames);
	const int32 NewOutputIndex = FindTensor(Outputs, UTF8_TO_TCHAR(output_name.c_str()), OutputNames);
	if (InputIndex == INDEX_NONE || Inputs.Num() != 1 || NewOutputIndex == INDEX_NONE)
	{
		const FString What = FString::Printf(
			TEXT("the model must have one input named '%s' (its inputs: %s) and an output named '%s' (its outputs: %s)"),
			UTF8_TO_TCHAR(input_name.c_str()), InputNames.IsEmpty() ? TEXT("none") : *InputNames,
			UTF8_TO_TCHAR(output_name.c_str()), OutputNames.IsEmpty() ? TEXT("none") : *OutputNames);
		NewInstance.Reset();
		NewModel.Reset();
		ReleaseModelData(NewData);
		return Failed(What);
	}
	const std::size_t NewObsDim = LastDimension(Inputs[InputIndex]);
	const std::size_t NewOutDim = LastDimension(Outputs[NewOutputIndex]);
	const int32 OutputCount = Outputs.Num();
	// Replaced only on success: a model that fails to load leaves the previous one in use.
	TStrongObjectPtr<UNNEModelData> OldData = MoveTemp(ModelData);
	ModelData = MoveTemp(NewData);
	Model = MoveTemp(NewModel);
	ModelInstance = MoveTemp(NewInstance);
	ReleaseModelData(OldData);
	ObsDim = NewObsDim;
	OutDim = NewOutDim;
	OutputIndex = NewOutputIndex;
	OutputBindings.SetNum(OutputCount);
	for (UE::NNE::FTensorBindingCPU& Binding : OutputBindings)
	{
		Binding = UE::NNE::FTensorBindingCPU{nullptr, 0};
	}
	BoundBatch = 0;
	return tether::Status::Ok();
}

tether::Status FTetherNNEBackend::run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                                      std::size_t out_dim)
{
	if (!ModelInstance.IsValid())
	{
		return tether::Status(tether::ErrorCode::kNotReady, "no model loaded");
	}
	if ((ObsDim != 0 && obs_dim != ObsDim) || (OutDim != 0 && out_dim != OutDim))
	{
		return tether::Status(tether::ErrorCode::kInvalidArgument, "observation or output width does not match the model");
	}
	if (batch != BoundBatch)
	{
		const uint32 Dims[2] = {static_cast<uint32>(batch), static_cast<uint32>(obs_dim)};
		const UE::NNE::FTensorShape Shape = UE::NNE::FTensorShape::Make(Dims);
		if (ModelInstance->SetInputTensorShapes(MakeArrayView(&Shape, 1)) !=
		    UE::NNE::IModelInstanceCPU::ESetInputTensorShapesStatus::Ok)
		{
			return Failed(FString::Printf(TEXT("NNE refused the input shape (%llu, %llu)"),
			                              static_cast<unsigned long long>(batch), static_cast<unsigned long long>(obs_dim)));
		}
		BoundBatch = batch;
	}
	const UE::NNE::FTensorBindingCPU Input{const_cast<float*>(obs), static_cast<uint64>(batch * obs_dim * sizeof(float))};
	OutputBindings[OutputIndex] = UE::NNE::FTensorBindingCPU{out, static_cast<uint64>(batch * out_dim * sizeof(float))};
	if (ModelInstance->RunSync(MakeArrayView(&Input, 1), OutputBindings) !=
	    UE::NNE::IModelInstanceCPU::ERunSyncStatus::Ok)
	{
		return Failed(TEXT("NNE RunSync failed"));
	}
	return tether::Status::Ok();
}
