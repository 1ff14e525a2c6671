"""Imports every backend feature module that registers frame handlers (see stub_features)."""
