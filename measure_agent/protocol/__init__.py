"""The fleet protocol (gRPC). Generated code lives in ``v1/``; regenerate with ``protos/generate.sh``."""

# Bumped on any incompatible change of the protocol's meaning; checked at registration.
PROTOCOL_VERSION = 1
