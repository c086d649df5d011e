"""The rank run-time: launching ranks (horovodrun, elastic plans), their environment and CPU threads, the
collectives they share (:mod:`~hvdtrain.runtime.distributed`), supervision, restarts and watchdogs."""
