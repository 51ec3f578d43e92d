"""Real runs: what ran, what it measured, the record of both, and where records are kept.

Below both `advisor` and `calibration` (which make and read runs), above `models` (whose fit
takes them as `MeasuredRun`s).
"""
