"""Calibrating the cost model from measurements: fitting (`fit`), the closed-loop check of
predictions against executor runs (`check`) and its report (`report`). The calibration file's
typed value lives in `simpar.sim.specs.calibration`."""
