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

// The last dimension of a model's first input or output (0 when it is variable).
std::size_t LastDimension(TConstArrayView<UE::NNE::FTensorDesc> Descs)
{
	if (Descs.Num() == 0)
	{
		return 0;
	}
	const TConstArrayView<int32> Shape = Descs[0].GetShape().GetData();
	return Shape.Num() > 0 && Shape.Last() > 0 ? static_cast<std::size_t>(Shape.Last()) : 0;
}
}  // namespace

FTetherNNEBackend::FTetherNNEBackend(const FString& InRuntimeName) : RuntimeName(InRuntimeName)
{
}

FTetherNNEBackend::~FTetherNNEBackend() = default;

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
		return Failed(FString::Printf(TEXT("NNE runtime '%s' cannot create a model from these %llu bytes"),
		                              *RuntimeName, static_cast<unsigned long long>(size)));
	}
	TSharedPtr<UE::NNE::IModelCPU> NewModel = Runtime->CreateModelCPU(NewData.Get());
	TSharedPtr<UE::NNE::IModelInstanceCPU> NewInstance = NewModel.IsValid() ? NewModel->CreateModelInstanceCPU() : nullptr;
	if (!NewInstance.IsValid())
	{
		return Failed(FString::Printf(TEXT("NNE runtime '%s' failed to create the model"), *RuntimeName));
	}
	if (NewInstance->GetInputTensorDescs().Num() != 1 || NewInstance->GetOutputTensorDescs().Num() < 1)
	{
		return Failed(FString::Printf(TEXT("the model must have one input ('%hs') and an output ('%hs')"),
		                              input_name.c_str(), output_name.c_str()));
	}
	// Replaced only on success: a model that fails to load leaves the previous one in use.
	ModelData = MoveTemp(NewData);
	Model = MoveTemp(NewModel);
	ModelInstance = MoveTemp(NewInstance);
	ObsDim = LastDimension(ModelInstance->GetInputTensorDescs());
	OutDim = LastDimension(ModelInstance->GetOutputTensorDescs());
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
	const UE::NNE::FTensorBindingCPU Output{out, static_cast<uint64>(batch * out_dim * sizeof(float))};
	if (ModelInstance->RunSync(MakeArrayView(&Input, 1), MakeArrayView(&Output, 1)) !=
	    UE::NNE::IModelInstanceCPU::ERunSyncStatus::Ok)
	{
		return Failed(TEXT("NNE RunSync failed"));
	}
	return tether::Status::Ok();
}
