"""A user's application, written only against durable-agent's documented API: its own
tools (gift vouchers, kept in a ledger file), its own agents, scripted model and crash-matrix
scenario. The tests run it the way its authors would: through the CLI and the pytest plugin.
"""
