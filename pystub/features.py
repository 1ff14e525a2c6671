"""Imports every stub feature module that registers frame handlers (see stub_features)."""
