"""Reference decoders: the read paths the fast readers replaced, kept as test oracles (compared item
for item with the fast readers in tests/integration) and for benchmarks. Not shipped."""
