"""Scheduling: how the requests of a model version reach its instances.

    choice.make_scheduler(config, instances, stats) ──▶ one of
        default.DefaultScheduler       the next free instance (pipelined), no batching
        multiplex.MultiplexScheduler   the default one, routing by multiplexed model id
        dynamic.DynamicBatcher         batches of single requests (request_queue: levels, policies)
        sequence.SequenceBatcher       one slot per live sequence (sequence_slots,
                                       sequence_stubs: the state it shares with its stubs)
    all on base.Scheduler: the worker loop, failure accounting and statistics

The public modules are listed below; import what you use from them (the package imports none of
them itself, so importing one scheduler does not load the others).
"""

__all__ = ["base", "choice", "default", "dynamic", "multiplex", "multiplex_queue", "multiplex_stats", "request_queue",
           "sequence", "sequence_slots", "sequence_stubs"]
