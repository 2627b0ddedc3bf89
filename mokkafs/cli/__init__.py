"""What a user runs: the `mokka` command (`main`), `mokka run`, `mokka scenario`,
`mokka profile record`, and the control socket's client."""
