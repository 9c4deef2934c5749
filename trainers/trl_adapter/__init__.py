"""The TRL adapter: every import of TRL and every touch of its trainers' internals."""
