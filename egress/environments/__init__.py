"""Where specs come from: one spec file, or a directory of environments chosen by
proxy credentials, each reloaded when its file changes."""
