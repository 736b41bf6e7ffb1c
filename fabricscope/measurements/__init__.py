"""Measurement declarations, one module per probe family (see fabricscope.schema)."""
