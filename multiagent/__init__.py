"""Multi-agent Tether: policy mapping, agent groups, hierarchy and the PettingZoo adapter."""

from .policy_mapping import MappingRule, PolicyMapping, UnmappedAgentError, fnv1a32

__all__ = ["MappingRule", "PolicyMapping", "UnmappedAgentError", "fnv1a32"]
