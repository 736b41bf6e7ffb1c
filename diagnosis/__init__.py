"""Diagnosis: from the agents' telemetry to findings (cause, place, impact, evidence,
advice), live in the collector and after the fact from the store; and the
before/after comparison that verifies a change. See docs/DIAGNOSIS.md."""
