"""The shared-memory edge: the state file's layout as Python sees it (`layout`), the daemon
writing the node into it (`publisher`), and CUDA processes' accounting records (`proctable`)."""
