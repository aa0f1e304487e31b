"""Which waiting containers fail a Kubernetes run at once and which the kubelet is given time
to retry (torbed.backends.k8s.backend._pod_problem), on the API's own pod objects."""

from __future__ import annotations

from kubernetes.client import (V1ContainerState, V1ContainerStateWaiting, V1ContainerStatus, V1ObjectMeta,
                               V1Pod, V1PodStatus)

from torbed.backends.k8s import backend


def _pod(reason: str, message: str, restarts: int = 0) -> V1Pod:
    st = V1ContainerStatus(name="results", image="torbed/results:x", image_id="", ready=False,
                           restart_count=restarts,
                           state=V1ContainerState(waiting=V1ContainerStateWaiting(reason=reason, message=message)))
    return V1Pod(metadata=V1ObjectMeta(name="rel-results-0"), status=V1PodStatus(phase="Pending", container_statuses=[st]))


SYNC = "failed to sync secret cache: timed out waiting for the condition"


def test_a_secret_cache_timeout_is_given_time_then_fails():
    pod, seen = _pod("CreateContainerConfigError", SYNC), {}
    assert backend._pod_problem(pod, seen, now=100.0) is None
    assert backend._pod_problem(pod, seen, now=100.0 + backend.CONFIG_GRACE_S - 1) is None
    why = backend._pod_problem(pod, seen, now=100.0 + backend.CONFIG_GRACE_S)
    assert why and "rel-results-0" in why and "container results" in why and "CreateContainerConfigError for 60 s" in why


def test_a_missing_secret_fails_at_once():
    pod = _pod("CreateContainerConfigError", 'secret "rel-keys" not found')
    why = backend._pod_problem(pod, {}, now=5.0)
    assert why and 'secret "rel-keys" not found' in why


def test_without_memory_a_retried_reason_is_fatal_and_image_problems_always_are():
    assert backend._pod_problem(_pod("CreateContainerError", "context deadline exceeded")) is not None
    assert backend._pod_problem(_pod("ErrImageNeverPull", "not present"), {}, now=0.0) is not None
    assert backend._pod_problem(_pod("ContainerCreating", ""), {}, now=0.0) is None


def test_crash_loops_fail_after_three_restarts():
    assert backend._pod_problem(_pod("CrashLoopBackOff", "back-off 10s", restarts=2), {}, now=0.0) is None
    assert "keeps crashing (3 restarts)" in backend._pod_problem(_pod("CrashLoopBackOff", "", restarts=3), {}, now=0.0)
