"""Tiers: a project's inference configurations of a checkpoint (how fast, how capable), and tier
evaluations that measure one checkpoint under several of them. Below runs, which launch on a tier."""
