"""Whether a run got slower: ``compare`` (two runs, stage by stage, with bootstrap intervals), ``rules`` (the gate's
bands and floor), ``regress`` (a baseline re-measured in rounds, suspects confirmed) and ``report`` (the verdicts as
text, markdown and JSON)."""
