// gymnasium's CartPole-v1 in C++: the engine side of the CartPole examples
// (cartpole.cpp, scripted_team.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "tether/distributions.h"

namespace tether_examples {

/// gymnasium's CartPole-v1: the same constants, Euler integration, termination
/// at |x| > 2.4 or |theta| > 12 degrees, truncation after 500 steps, reset
/// to uniform(-0.05, 0.05) in every state variable.
class CartPole {
 public:
  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassCart + kMassPole;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;
  static constexpr double kThetaThreshold = 12.0 * 2.0 * M_PI / 360.0;
  static constexpr double kXThreshold = 2.4;
  static constexpr int kMaxEpisodeSteps = 500;

  explicit CartPole(std::uint64_t seed) : rng_(seed) {}

  void reset(float* obs) {
    for (double& s : state_) s = -0.05 + 0.1 * rng_.uniform();
    steps_ = 0;
    observe(obs);
  }

  /// Applies action 0 (push left) or 1 (push right); returns the reward.
  double step(int action, float* obs, bool& terminated, bool& truncated) {
    double& x = state_[0];
    double& x_dot = state_[1];
    double& theta = state_[2];
    double& theta_dot = state_[3];
    const double force = action == 1 ? kForceMag : -kForceMag;
    const double costheta = std::cos(theta);
    const double sintheta = std::sin(theta);
    const double temp = (force + kPoleMassLength * theta_dot * theta_dot * sintheta) / kTotalMass;
    const double thetaacc =
        (kGravity * sintheta - costheta * temp) / (kLength * (4.0 / 3.0 - kMassPole * costheta * costheta / kTotalMass));
    const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
    x = x + kTau * x_dot;
    x_dot = x_dot + kTau * xacc;
    theta = theta + kTau * theta_dot;
    theta_dot = theta_dot + kTau * thetaacc;
    ++steps_;
    terminated = x < -kXThreshold || x > kXThreshold || theta < -kThetaThreshold || theta > kThetaThreshold;
    truncated = !terminated && steps_ >= kMaxEpisodeSteps;
    observe(obs);
    return 1.0;
  }

 private:
  void observe(float* obs) const {
    for (int i = 0; i < 4; ++i) obs[i] = static_cast<float>(state_[i]);
  }
  double state_[4] = {0, 0, 0, 0};
  int steps_ = 0;
  tether::Rng rng_;
};

}  // namespace tether_examples
