"""SGL0xx / SLOT0xx engine rules (registered by the engine profiles)."""
