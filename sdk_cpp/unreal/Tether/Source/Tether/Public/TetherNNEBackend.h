// The inference backend that runs Tether's policy models with Unreal's Neural
// Network Engine (NNE) on the CPU, by default through NNERuntimeORTCpu: the
// ONNX Runtime the engine already ships, so the game bundles no second copy.
// It implements the SDK's one inference seam (tether/inference.h). Compiled
// only inside Unreal (UE 5.4 or later).
#pragma once

#include "CoreMinimal.h"
#include "NNEModelData.h"
#include "NNERuntimeCPU.h"
#include "UObject/StrongObjectPtr.h"

#include "tether/inference.h"

/**
 * Runs one policy model with an NNE CPU runtime.
 *
 * load() runs on the client's I/O thread (a model swap never costs the game
 * thread a frame), and so does the destructor of a model swapped out (the SDK
 * hands it back to that thread); run() runs on the thread that calls
 * GetAction. The input and output are the model's tensors with the names the
 * server gives (onnx_input_names[0], onnx_output_names[0]); they bind the
 * caller's buffers directly, any other output is left to the runtime; shapes
 * are set again only when the batch size changes.
 */
class TETHER_API FTetherNNEBackend final : public tether::InferenceBackend
{
public:
	/** A backend that will use the NNE runtime named InRuntimeName (see UE::NNE::GetAllRuntimeNames). */
	explicit FTetherNNEBackend(const FString& InRuntimeName = TEXT("NNERuntimeORTCpu"));
	virtual ~FTetherNNEBackend() override;

	/**
	 * See tether::InferenceBackend::load: creates the NNE model and one instance from the ONNX bytes, and finds
	 * its input named input_name (the model's only input) and its output named output_name.
	 */
	virtual tether::Status load(const std::uint8_t* model, std::size_t size, const std::string& input_name,
	                            const std::string& output_name) override;
	/** See tether::InferenceBackend::run. */
	virtual tether::Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
	                           std::size_t out_dim) override;
	/** See tether::InferenceBackend::loaded. */
	virtual bool loaded() const noexcept override { return ModelInstance.IsValid(); }
	/** See tether::InferenceBackend::obs_dim. */
	virtual std::size_t obs_dim() const noexcept override { return ObsDim; }
	/** See tether::InferenceBackend::out_dim. */
	virtual std::size_t out_dim() const noexcept override { return OutDim; }

private:
	FString RuntimeName;
	TStrongObjectPtr<UNNEModelData> ModelData;
	TSharedPtr<UE::NNE::IModelCPU> Model;
	TSharedPtr<UE::NNE::IModelInstanceCPU> ModelInstance;
	std::size_t ObsDim = 0;
	std::size_t OutDim = 0;
	std::size_t BoundBatch = 0;
	/** One binding per model output (NNE takes all or none); OutputIndex's is the caller's buffer. */
	TArray<UE::NNE::FTensorBindingCPU> OutputBindings;
	int32 OutputIndex = 0;
};
