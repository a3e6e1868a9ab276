"""OffloadingConnectorWorker's job bookkeeping (vLLM 0.19.1, vllm/distributed/kv_transfer/kv_connector/
v1/offloading/worker.py), and the oracle's fake worker whose transfers take a set number of engine
steps instead of copying bytes.

`OffloadJobs` is the one implementation of the worker's rules (which job completes when it is seen,
which finished request is reported once its stores all landed); it orders completion by any
comparable key: the fake worker's execution index, or the simulator's clock (simulator/kv_offload.py,
whose transfers take bytes / link rate).

Shared by the oracle driver (tools/offload_oracle.py, which runs it beside the real vLLM scheduler and
loads this file by path) and the replay (scheduler/kv_offload/replay.py): it reads only what both
schedulers' outputs spell alike (`kv_connector_metadata.reqs_to_load / reqs_to_store / reqs_to_flush`,
`total_num_scheduled_tokens`, `finished_req_ids`), so it imports nothing.
"""

from __future__ import annotations

from collections import defaultdict


class OffloadJobs:
    """The worker's jobs and when each completes (`done`: any key comparable with get_finished's
    `now`). finished_sending names a request only once it finished and has no store job left."""

    def __init__(self) -> None:
        self.job_counter = 0
        self.jobs: dict[int, tuple[str, bool, object]] = {}  # job -> (req, is_store, done)
        self.load_job: dict[str, int] = {}
        self.store_jobs: dict[str, set[int]] = defaultdict(set)
        self.finished_waiting_for_store: set[str] = set()

    def _new_job(self, req_id: str, store: bool, done) -> int:
        job = self.job_counter
        self.job_counter += 1
        self.jobs[job] = (req_id, store, done)
        return job

    def add_load(self, req_id: str, done) -> None:
        assert req_id not in self.load_job
        self.load_job[req_id] = self._new_job(req_id, False, done)

    def add_store(self, req_id: str, done) -> None:
        self.store_jobs[req_id].add(self._new_job(req_id, True, done))

    def flush(self, req_id: str, done) -> None:
        """handle_preemptions: the worker waits for every store of the request, so they complete now."""
        for job in self.store_jobs.get(req_id, ()):
            r, s, _ = self.jobs[job]
            self.jobs[job] = (r, s, done)

    def next_done(self):
        """The earliest completion key of a job in flight, or None."""
        return min((done for _, _, done in self.jobs.values()), default=None)

    def get_finished(self, now, finished_req_ids) -> tuple[list[str], list[str]]:
        """(finished_sending, finished_recving) of the worker's get_finished at `now`, each in the
        order the real worker adds them to its sets (their iteration order follows)."""
        sending: dict[str, None] = {}  # ordered sets
        recving: dict[str, None] = {}
        for job in sorted(j for j, (_, _, done) in self.jobs.items() if done <= now):
            rid, store, _ = self.jobs.pop(job)
            if store:
                req_jobs = self.store_jobs[rid]
                req_jobs.remove(job)
                if req_jobs:
                    continue
                if rid in self.finished_waiting_for_store:
                    self.finished_waiting_for_store.remove(rid)
                    sending[rid] = None
                    del self.store_jobs[rid]
            else:
                assert self.load_job.pop(rid) == job
                recving[rid] = None
        for rid in finished_req_ids:
            pending = self.store_jobs.get(rid)
            if pending:
                self.finished_waiting_for_store.add(rid)
            elif pending is not None:
                sending[rid] = None
                del self.store_jobs[rid]
        return list(sending), list(recving)


class FakeOffloadWorker:
    """The worker with transfers timed in steps: a load submitted in execution n completes in
    execution n + load_steps (seen by that execution's get_finished); a store prepared in execution n
    (wait_for_save, submitted at the start of n + 1) completes in execution n + store_steps;
    handle_preemptions waits for every store of a flushed request, so those complete in the execution
    that flushes them."""

    def __init__(self, load_steps: int, store_steps: int):
        self.load_steps, self.store_steps = load_steps, store_steps
        self.exec_idx = -1
        self.book = OffloadJobs()

    def execute(self, so, set_iter=iter) -> tuple[list[str], list[str]]:
        """Run one engine step's transfers: (finished_sending, finished_recving) of its get_finished.
        set_iter(so.finished_req_ids): that set's iteration order in the real engine (the oracle runs
        with PYTHONHASHSEED=0; a replay in another process passes scheduler/pyset.py's set_order)."""
        self.exec_idx += 1
        n, book = self.exec_idx, self.book
        meta = so.kv_connector_metadata
        for rid in meta.reqs_to_flush or ():
            book.flush(rid, n)
        for rid in meta.reqs_to_load:  # start_kv_transfers
            book.add_load(rid, n + self.load_steps)
        if so.total_num_scheduled_tokens > 0:  # wait_for_save -> prepare_store_kv (forward only)
            for rid in meta.reqs_to_store:
                book.add_store(rid, n + self.store_steps)
        return book.get_finished(n, set_iter(so.finished_req_ids))
