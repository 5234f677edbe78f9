"""The evals of the pattern, as commands: crash matrix, replay, heed-note, two workers."""
