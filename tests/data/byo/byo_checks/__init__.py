"""User functions the tests run through spec.trainFunction (a package of its own, as a user ships one)."""
