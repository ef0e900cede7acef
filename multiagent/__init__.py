"""Multi-agent Tether: policy mapping, agent groups, hierarchy and the PettingZoo adapter.

The mapping rules are part of the protocol (every SDK evaluates them), so they
live in ``tether.protocol.policy_mapping``; they are re-exported here.
"""

from tether.protocol.policy_mapping import MappingRule, PolicyMapping, UnmappedAgentError, fnv1a32

__all__ = ["MappingRule", "PolicyMapping", "UnmappedAgentError", "fnv1a32"]
