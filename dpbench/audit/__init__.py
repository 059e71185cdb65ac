"""Empirical privacy audits of trained models (canary exposure, Carlini et al.'s Secret Sharer)."""
