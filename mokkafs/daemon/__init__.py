"""The daemon: every edge between the model and the world (FUSE, the shared state, sockets,
persistence, the clock, the scenario runner, /metrics), and its lifetime (`lifetime`), which
builds them on one clock and tears them down."""
