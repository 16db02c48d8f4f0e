"""The rules' matchers, one module per concern: collectives, no_sync, the launcher's environment, devices, data
loading, and the call patterns. Each matcher takes a Project and yields Hits."""
