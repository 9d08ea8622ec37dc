"""The fleet protocol (gRPC). Generated code lives in ``v1/`` and ``v2/``; regenerate with ``protos/generate.sh``.

Version 2 (``v2/``) is the agents' protocol: one stream per agent. Version 1 (``v1/``) keeps the
clients' ClientService and the messages v2 reuses; its unary agent calls remain only so that an
agent of the other version hears one clear line naming both versions.
"""

# Bumped on any incompatible change of the protocol's meaning; checked at registration.
PROTOCOL_VERSION = 2
# What an agent of the unary protocol (measure_agent.protocol.v1.AgentService) says it speaks.
V1_PROTOCOL_VERSION = 1
