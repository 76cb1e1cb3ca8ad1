"""The service shell: the daemon and its scheduler, metrics and health, the HTTP API,
`describe-storage` and the demo. It wires the layers below together; nothing below imports it."""
