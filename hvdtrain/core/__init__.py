"""What every subsystem shares: the job config, the task kinds, the error types, secrets and their redaction."""
