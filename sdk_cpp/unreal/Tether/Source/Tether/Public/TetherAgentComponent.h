// One learning agent on an actor: connects to a Tether server without blocking
// BeginPlay, acts with the local model (NNE), sends its experience on the SDK's
// background thread, reports errors to the log and to a delegate. A thin
// adapter over tether::TetherClient (sdk_cpp/include/tether/client.h), which
// holds all the logic; compiled only inside Unreal.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "Components/ActorComponent.h"
#include "CoreMinimal.h"

#include "TetherAgentComponent.generated.h"

namespace tether
{
class Status;
class TetherClient;
}
struct FTetherConnectTask;

DECLARE_LOG_CATEGORY_EXTERN(LogTether, Log, All);

/** A server error or refusal: the protocol error code (e.g. "INVALID_FIELD", "TIMEOUT") and its message. */
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FTetherErrorSignature, const FString&, Code, const FString&, Message);

/**
 * Connects one agent to `tether serve`. Call StartEpisode, then each decision
 * GetAction (observation in, action out), or LogAction for an action the policy
 * did not choose, and LogReward, and EndEpisode with the final observation. GetAction never waits for the network. An error of the
 * server (e.g. a refusal of an earlier batch) goes to OnError and costs no
 * call: the SDK returns it, once, from the next call, which then did nothing
 * else, and the component makes that call again.
 */
UCLASS(ClassGroup = (AI), meta = (BlueprintSpawnableComponent))
class TETHER_API UTetherAgentComponent : public UActorComponent
{
	GENERATED_BODY()

public:
	UTetherAgentComponent();

	/** Server address. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	FString Host = TEXT("127.0.0.1");

	/** Server port. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	int32 Port = 5555;

	/** Sent in PING when the server requires a token (empty: none). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	FString AuthToken;

	/** Shown in the server's logs. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	FString ClientName = TEXT("tether-unreal");

	/** NNE runtime that runs the model on the CPU. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	FString NNERuntimeName = TEXT("NNERuntimeORTCpu");

	/**
	 * Protocol 1.6: write every episode played (its policy's steps and LogAction's alike) to this
	 * demonstration file (JSON Lines; created or replaced when the connection is made), which
	 * `tether pretrain --dataset` trains from; a relative path is under the project's Saved folder.
	 * Each component writes its own file: give each agent its own path. Empty: none.
	 */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	FString DemoPath;

	/**
	 * An offline policy file (a server's offline_policy.json, docs/protocol.md §20): the agent acts with its
	 * policy and no server is reached; nothing is sent (DemoPath is still written). A relative path is under
	 * the project's Content folder (add the file's folder to "Additional Non-Asset Directories To Copy" to
	 * ship it). Empty: connect to Host:Port.
	 */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	FString OfflinePolicyPath;

	/** Keep retrying a lost server this long, then give up (seconds). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "Tether")
	float ReconnectTimeoutSeconds = 60.f;

	/** Called on the game thread for every error the client reports (once each). */
	UPROPERTY(BlueprintAssignable, Category = "Tether")
	FTetherErrorSignature OnError;

	/** Whether the first connection (and its model) is ready. */
	UFUNCTION(BlueprintCallable, Category = "Tether")
	bool IsConnected() const;

	/**
	 * Whether the server said its run is done (ERROR TRAINING_DONE, protocol 1.3): the normal end of
	 * training, not an error. GetAction goes on acting with the last model; nothing is sent any more,
	 * and the client does not reconnect (the summary: Client()->training_summary()).
	 */
	UFUNCTION(BlueprintCallable, Category = "Tether")
	bool IsTrainingDone() const;

	/** Begins an episode; false before the connection is ready. */
	UFUNCTION(BlueprintCallable, Category = "Tether")
	bool StartEpisode();

	/** The action for Observation (Action gets one number per action dimension); false on an error (logged). */
	UFUNCTION(BlueprintCallable, Category = "Tether")
	bool GetAction(const TArray<float>& Observation, TArray<float>& Action);

	/**
	 * Protocol 1.6 log_action: records Action as the step taken on Observation although the policy did not
	 * choose it (a player's input, a scripted bot), so that the server learns from it (behavioural cloning)
	 * without taking it for a sample of its policy; call it in place of GetAction, in any mix with it. Action:
	 * one number per action dimension (a Discrete action as its value). False on an error (logged): a wrong
	 * size, a value outside the action space or forbidden by the observation's mask, a server older than 1.6.
	 */
	UFUNCTION(BlueprintCallable, Category = "Tether")
	bool LogAction(const TArray<float>& Observation, const TArray<float>& Action);

	/** Adds Reward to the last action. */
	UFUNCTION(BlueprintCallable, Category = "Tether")
	void LogReward(float Reward);

	/** Ends the episode with its last observation (bTruncated: ended by a time limit); returns its total reward. */
	UFUNCTION(BlueprintCallable, Category = "Tether")
	float EndEpisode(const TArray<float>& FinalObservation, bool bTruncated);

	/** The client, once connected (C++ users may call its full API, e.g. flush()); null before. */
	tether::TetherClient* Client() const { return Connected.get(); }

protected:
	virtual void BeginPlay() override;
	virtual void EndPlay(const EEndPlayReason::Type EndPlayReason) override;
	virtual void TickComponent(float DeltaTime, ELevelTick TickType, FActorComponentTickFunction* ThisTickFunction) override;

private:
	void Report(const FString& Code, const FString& Message);
	bool RetryAfter(const tether::Status& Status, tether::Status& Previous);

	TSharedPtr<FTetherConnectTask> Connecting;
	std::unique_ptr<tether::TetherClient> Connected;
	std::string Episode;
	std::vector<double> ActionBuffer;
	std::vector<double> LoggedBuffer;  // (LogAction's, reused: no allocation per call once sized)
};
