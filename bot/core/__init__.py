"""The platform-agnostic engine: messages, sessions, stores, agents, runner, models."""
