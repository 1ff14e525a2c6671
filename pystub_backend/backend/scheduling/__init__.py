"""Scheduling: how the requests of a model version reach its instances.

    choice.make_scheduler(config, instances, stats) ──▶ one of
        default.DefaultScheduler       the next free instance (pipelined), no batching
        multiplex.MultiplexScheduler   the default one, routing by multiplexed model id
        dynamic.DynamicBatcher         batches of single requests (request_queue: levels, policies)
        sequence.SequenceBatcher       one slot per live sequence (sequence_slots, sequence_controls,
                                       sequence_stubs: the state it shares with its stubs)
    all on base.Scheduler: the worker loop, failure accounting and statistics

The public modules are listed below; import what you use from them (the package imports none of
them itself: model configs import `sequence_controls`, so importing them here would be a cycle).
"""

__all__ = ["base", "choice", "default", "dynamic", "multiplex", "multiplex_queue", "request_queue", "sequence",
           "sequence_controls", "sequence_slots", "sequence_stubs"]
