// How the example programs survive the server's errors. The SDK returns an
// error of the server (a refusal of an earlier batch, e.g. DATA_REFUSED or
// INVALID_FIELD; a connection-level ERROR; a batch that timed out or was given
// up) once, from the next call, and that call did nothing else: the program
// prints it and makes the call again, as examples/check_client_python.py does
// with ServerError and examples/csharp/CheckClient.cs with TetherException.
#pragma once

#include <cstdio>

#include "tether/status.h"

namespace examples {

inline const tether::Status& status_of(const tether::Status& status) { return status; }

template <class T>
const tether::Status& status_of(const tether::Result<T>& result) {
  return result.status();
}

/// Makes `call` (a call of `client`'s, TetherClient or MultiAgentClient) until
/// it succeeds, printing each error of the server it returns
/// ("<program>: server reported CODE: message"). Returns the last call's
/// result: ok; the fatal status once the link gave up; or a failure that
/// repeats alike (the call's own error, e.g. a wrong size: the server's come
/// once each).
template <class Client, class Call>
auto surviving(const char* program, const Client& client, Call call) -> decltype(call()) {
  auto result = call();
  for (;;) {
    const tether::Status failed = status_of(result);
    if (failed.ok() || !client.fatal_error().ok()) return result;
    std::printf("%s: server reported %s\n", program, failed.to_string().c_str());
    std::fflush(stdout);
    result = call();
    const tether::Status& again = status_of(result);
    if (again.code() == failed.code() && again.message() == failed.message()) return result;
  }
}

}  // namespace examples
