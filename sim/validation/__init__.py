"""Predictions against measurements: published runs (`published`, `published_report`), the
accuracy report over published and closed-loop runs (`accuracy`, `accuracy_report`) and
simulated-vs-measured traces (`compare`)."""
