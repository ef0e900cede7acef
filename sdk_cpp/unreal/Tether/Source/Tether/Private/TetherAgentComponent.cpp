// UTetherAgentComponent: adapts the SDK's TetherClient to an actor component.
#include "TetherAgentComponent.h"

#include "Async/Async.h"
#include "HAL/CriticalSection.h"
#include "Misc/Paths.h"
#include "Misc/ScopeLock.h"

#include "TetherNNEBackend.h"
#include "tether/client.h"

DEFINE_LOG_CATEGORY(LogTether);

namespace
{
FString CodeOf(const tether::Status& Status)
{
	return UTF8_TO_TCHAR(std::string(tether::to_string(Status.code())).c_str());
}

FString MessageOf(const tether::Status& Status)
{
	return UTF8_TO_TCHAR(Status.message().c_str());
}
}  // namespace

// The connect call runs on a background thread (it retries for up to the reconnect
// timeout); the component picks the client up in TickComponent. If the component
// ends first, the task closes the client itself.
struct FTetherConnectTask
{
	FCriticalSection Lock;
	bool bDone = false;
	bool bAbandoned = false;
	std::unique_ptr<tether::TetherClient> Client;
	tether::Status Error;
};

UTetherAgentComponent::UTetherAgentComponent()
{
	PrimaryComponentTick.bCanEverTick = true;
}

void UTetherAgentComponent::BeginPlay()
{
	Super::BeginPlay();
	tether::ClientOptions Options;
	Options.host = TCHAR_TO_UTF8(*Host);
	Options.port = static_cast<std::uint16_t>(FMath::Clamp(Port, 1, 65535));
	Options.client_name = TCHAR_TO_UTF8(*ClientName);
	if (!AuthToken.IsEmpty())
	{
		Options.auth_token = std::string(TCHAR_TO_UTF8(*AuthToken));
	}
	Options.reconnect_timeout_s = ReconnectTimeoutSeconds;
	if (!DemoPath.IsEmpty())
	{
		// (a relative path is under the project's Saved folder, not the editor's working folder)
		const FString Demos = FPaths::IsRelative(DemoPath) ? FPaths::Combine(FPaths::ProjectSavedDir(), DemoPath) : DemoPath;
		Options.demo_path = std::string(TCHAR_TO_UTF8(*Demos));
	}
	if (!OfflinePolicyPath.IsEmpty())
	{
		// (ProjectContentDir is relative to the working folder: made absolute for fopen)
		const FString Policy = FPaths::IsRelative(OfflinePolicyPath)
		                           ? FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectContentDir(), OfflinePolicyPath))
		                           : OfflinePolicyPath;
		Options.offline_policy = std::string(TCHAR_TO_UTF8(*Policy));
	}
	const FString Runtime = NNERuntimeName;
	Options.backend_factory = [Runtime] { return std::make_unique<FTetherNNEBackend>(Runtime); };
	TSharedPtr<FTetherConnectTask> Task = MakeShared<FTetherConnectTask>();
	Connecting = Task;
	Async(EAsyncExecution::Thread, [Task, Options = MoveTemp(Options)]() mutable {
		tether::Result<std::unique_ptr<tether::TetherClient>> Result = tether::TetherClient::connect(MoveTemp(Options));
		FScopeLock Guard(&Task->Lock);
		Task->bDone = true;
		if (!Result.ok())
		{
			Task->Error = Result.status();
		}
		else if (!Task->bAbandoned)
		{
			Task->Client = MoveTemp(Result).value();
		}
		// else: the component ended meanwhile; the client closes as it goes out of scope here.
	});
}

void UTetherAgentComponent::EndPlay(const EEndPlayReason::Type EndPlayReason)
{
	if (Connecting.IsValid())
	{
		FScopeLock Guard(&Connecting->Lock);
		Connecting->bAbandoned = true;
		Connecting->Client.reset();
	}
	Connecting.Reset();
	if (Connected)
	{
		Connected->close();
		Connected.reset();
	}
	Super::EndPlay(EndPlayReason);
}

void UTetherAgentComponent::TickComponent(float DeltaTime, ELevelTick TickType,
                                          FActorComponentTickFunction* ThisTickFunction)
{
	Super::TickComponent(DeltaTime, TickType, ThisTickFunction);
	if (Connecting.IsValid())
	{
		FScopeLock Guard(&Connecting->Lock);
		if (Connecting->bDone)
		{
			Connected = MoveTemp(Connecting->Client);
			const tether::Status Error = Connecting->Error;
			Guard.Unlock();
			Connecting.Reset();
			if (!Error.ok())
			{
				Report(CodeOf(Error), MessageOf(Error));
			}
		}
	}
	if (Connected)
	{
		// Errors of the server no call returned (they came while none was made): reported as they arrive.
		for (tether::Status Error = Connected->take_error(); !Error.ok(); Error = Connected->take_error())
		{
			Report(CodeOf(Error), MessageOf(Error));
		}
	}
}

// Whether a call that returned Status is to be made again: the client returns each error of the
// server (a refusal of an earlier batch, a timeout) once, from the next call, which then did nothing
// else; it is reported here. Not once the link gave up for good, nor when the call failed just as it
// did before (Previous: then it is the call's own error, e.g. a wrong size).
bool UTetherAgentComponent::RetryAfter(const tether::Status& Status, tether::Status& Previous)
{
	if (Status.ok() || !Connected->fatal_error().ok() ||
	    (Status.code() == Previous.code() && Status.message() == Previous.message()))
	{
		return false;
	}
	Report(CodeOf(Status), MessageOf(Status));
	Previous = Status;
	return true;
}

bool UTetherAgentComponent::IsConnected() const
{
	return Connected != nullptr && Connected->fatal_error().ok();
}

bool UTetherAgentComponent::IsTrainingDone() const
{
	return Connected != nullptr && Connected->training_done();
}

bool UTetherAgentComponent::StartEpisode()
{
	if (!Connected)
	{
		return false;
	}
	if (!Episode.empty())
	{
		Report(TEXT("INVALID_ARGUMENT"), TEXT("StartEpisode: the previous episode was not ended"));
		return false;
	}
	tether::Result<std::string> Started = Connected->start_episode();
	for (tether::Status Previous; RetryAfter(Started.status(), Previous);)
	{
		Started = Connected->start_episode();
	}
	if (!Started.ok())
	{
		Report(CodeOf(Started.status()), MessageOf(Started.status()));
		return false;
	}
	Episode = MoveTemp(Started).value();
	ActionBuffer.resize(Connected->action_space().flat_dim());
	return true;
}

bool UTetherAgentComponent::GetAction(const TArray<float>& Observation, TArray<float>& Action)
{
	if (!Connected || Episode.empty())
	{
		return false;
	}
	tether::Status Acted;
	tether::Status Previous;
	do
	{
		Acted = Connected->get_action(Episode, Observation.GetData(), static_cast<std::size_t>(Observation.Num()),
		                              ActionBuffer.data(), ActionBuffer.size());
	} while (RetryAfter(Acted, Previous));
	if (!Acted.ok())
	{
		Report(CodeOf(Acted), MessageOf(Acted));
		return false;
	}
	Action.SetNumUninitialized(static_cast<int32>(ActionBuffer.size()), EAllowShrinking::No);
	for (int32 I = 0; I < Action.Num(); ++I)
	{
		Action[I] = static_cast<float>(ActionBuffer[static_cast<std::size_t>(I)]);
	}
	return true;
}

bool UTetherAgentComponent::LogAction(const TArray<float>& Observation, const TArray<float>& Action)
{
	if (!Connected || Episode.empty())
	{
		return false;
	}
	LoggedBuffer.resize(static_cast<std::size_t>(Action.Num()));
	for (int32 I = 0; I < Action.Num(); ++I)
	{
		LoggedBuffer[static_cast<std::size_t>(I)] = static_cast<double>(Action[I]);
	}
	tether::Status Logged;
	tether::Status Previous;
	do
	{
		Logged = Connected->log_action(Episode, Observation.GetData(), static_cast<std::size_t>(Observation.Num()),
		                               LoggedBuffer.data(), LoggedBuffer.size());
	} while (RetryAfter(Logged, Previous));
	if (!Logged.ok())
	{
		Report(CodeOf(Logged), MessageOf(Logged));
		return false;
	}
	return true;
}

void UTetherAgentComponent::LogReward(float Reward)
{
	if (Connected && !Episode.empty())
	{
		Connected->log_returns(Episode, Reward);
	}
}

float UTetherAgentComponent::EndEpisode(const TArray<float>& FinalObservation, bool bTruncated)
{
	if (!Connected || Episode.empty())
	{
		return 0.f;
	}
	tether::Result<double> Total = 0.0;
	tether::Status Previous;
	do
	{
		Total = Connected->end_episode(Episode, FinalObservation.GetData(),
		                               static_cast<std::size_t>(FinalObservation.Num()), bTruncated);
	} while (RetryAfter(Total.status(), Previous));
	Episode.clear();
	if (!Total.ok())
	{
		Report(CodeOf(Total.status()), MessageOf(Total.status()));
		return 0.f;
	}
	return static_cast<float>(Total.value());
}

void UTetherAgentComponent::Report(const FString& Code, const FString& Message)
{
	UE_LOG(LogTether, Warning, TEXT("%s: %s: %s"), *GetNameSafe(GetOwner()), *Code, *Message);
	OnError.Broadcast(Code, Message);
}
