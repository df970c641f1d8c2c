"""matplotlib figures: timelines and memory (`timeline`), pipeline schedules (`schedule`) and
cluster graphs (`topology`)."""
