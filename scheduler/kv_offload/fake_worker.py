"""The oracle's fake worker for the OffloadingConnector: OffloadingConnectorWorker's job bookkeeping
(vLLM 0.19.1, vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py) with transfers that
take a set number of engine steps instead of copying bytes.

Shared by the oracle driver (tools/offload_oracle.py, which runs it beside the real vLLM scheduler and
loads this file by path) and the replay (scheduler/kv_offload/replay.py): it reads only what both
schedulers' outputs spell alike (`kv_connector_metadata.reqs_to_load / reqs_to_store / reqs_to_flush`,
`total_num_scheduled_tokens`, `finished_req_ids`), so it imports nothing.
"""

from __future__ import annotations

from collections import defaultdict


class FakeOffloadWorker:
    """OffloadingConnectorWorker's job bookkeeping with timed transfers: a load submitted in
    execution n completes in execution n + load_steps (seen by that execution's get_finished);
    a store prepared in execution n (wait_for_save, submitted at the start of n + 1) completes in
    execution n + store_steps; handle_preemptions waits for every store of a flushed request, so
    those complete in the execution that flushes them. finished_sending names a request only once it
    finished and has no store job left (as the real worker)."""

    def __init__(self, load_steps: int, store_steps: int):
        self.load_steps, self.store_steps = load_steps, store_steps
        self.exec_idx = -1
        self.job_counter = 0
        self.jobs: dict[int, tuple[str, bool, int]] = {}  # job -> (req, is_store, done execution)
        self.load_job: dict[str, int] = {}
        self.store_jobs: dict[str, set[int]] = defaultdict(set)
        self.finished_waiting_for_store: set[str] = set()

    def _new_job(self, req_id: str, store: bool, done: int) -> int:
        job = self.job_counter
        self.job_counter += 1
        self.jobs[job] = (req_id, store, done)
        return job

    def execute(self, so, set_iter=iter) -> tuple[list[str], list[str]]:
        """Run one engine step's transfers: (finished_sending, finished_recving) of its get_finished,
        each in the order the real worker adds them to its sets (their iteration order follows).
        set_iter(so.finished_req_ids): that set's iteration order in the real engine (the oracle runs
        with PYTHONHASHSEED=0; a replay in another process passes scheduler/pyset.py's set_order)."""
        self.exec_idx += 1
        n = self.exec_idx
        meta = so.kv_connector_metadata
        for rid in meta.reqs_to_flush or ():  # handle_preemptions: wait for the request's stores
            for job in self.store_jobs.get(rid, ()):
                r, s, _ = self.jobs[job]
                self.jobs[job] = (r, s, n)
        for rid in meta.reqs_to_load:  # start_kv_transfers
            assert rid not in self.load_job
            self.load_job[rid] = self._new_job(rid, False, n + self.load_steps)
        if so.total_num_scheduled_tokens > 0:  # wait_for_save -> prepare_store_kv (forward only)
            for rid in meta.reqs_to_store:
                self.store_jobs[rid].add(self._new_job(rid, True, n + self.store_steps))
        return self._get_finished(set_iter(so.finished_req_ids))

    def _get_finished(self, finished_req_ids) -> tuple[list[str], list[str]]:
        sending: dict[str, None] = {}  # ordered sets
        recving: dict[str, None] = {}
        for job in sorted(j for j, (_, _, done) in self.jobs.items() if done <= self.exec_idx):
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
