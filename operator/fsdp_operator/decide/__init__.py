"""Pure decisions: the state machine, status folding, transport verdicts. No I/O."""
