"""Test support: stand-ins and drivers the tests share (never shipped in the product)."""
