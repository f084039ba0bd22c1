import random

import pytest
from _tidegate_fakes import FakeSink
from tidegate.errors import ErrorClass, FatalSinkError, NonRetryableSinkError, RetryableSinkError
from tidegate.retry import RetryFailure, backoff_delay, call_with_retry, policy_for
from tidegate.sinks.base import RetryPolicy, Sink
from tidegate.sinks.kafka.sink import KafkaSink
from tidegate.sinks.nats.sink import NatsSink
from tidegate.sinks.redis.sink import RedisSink

KAFKA_POLICY = RetryPolicy(0.1, 10.0, 3)
POLICY = RetryPolicy(0.05, 5.0, 3)


def _flaky(errors):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"
    return fn, calls


def classify(exc):
    return exc.error_class


def test_per_kind_policies():
    assert KafkaSink.retry_policy == KAFKA_POLICY
    assert NatsSink.retry_policy == RedisSink.retry_policy == POLICY

    class K(KafkaSink):
        def __init__(self):
            Sink.__init__(self, sink_id="k", pipeline="p")

    assert policy_for(K()) == KAFKA_POLICY
    assert policy_for(FakeSink("f")) == FakeSink.retry_policy  # a sink's own policy wins


def test_retryable_then_success_with_jittered_sleeps():
    fn, calls = _flaky([RetryableSinkError("a"), RetryableSinkError("b")])
    sleeps = []
    assert call_with_retry(fn, KAFKA_POLICY, classify, sleep=sleeps.append,
                           rng=random.Random(1)) == "ok"
    assert len(calls) == 3 and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2


def test_retries_exhausted():
    fn, calls = _flaky([RetryableSinkError("x")] * 5)
    with pytest.raises(RetryFailure) as ei:
        call_with_retry(fn, POLICY, classify, sleep=lambda s: None)
    assert len(calls) == 3 and ei.value.attempts == 3 and ei.value.error_class is ErrorClass.RETRYABLE


@pytest.mark.parametrize("err,cls", [(NonRetryableSinkError("n"), ErrorClass.NON_RETRYABLE),
                                     (FatalSinkError("f"), ErrorClass.FATAL)])
def test_no_retry_for_non_retryable_and_fatal(err, cls):
    fn, calls = _flaky([err])
    with pytest.raises(RetryFailure) as ei:
        call_with_retry(fn, POLICY, classify, sleep=lambda s: None)
    assert len(calls) == 1 and ei.value.error_class is cls and ei.value.cause is err


def test_backoff_is_capped_full_jitter():
    rng = random.Random(7)
    p = RetryPolicy(0.1, 1.0, 10)
    for n in range(10):
        d = [backoff_delay(p, n, rng) for _ in range(200)]
        cap = min(1.0, 0.1 * 2 ** n)
        assert all(0 <= x <= cap for x in d)
        assert max(d) > cap * 0.8  # spread over the whole interval


def test_stop_between_attempts():
    fn, calls = _flaky([RetryableSinkError("x")] * 5)
    with pytest.raises(RetryFailure):
        call_with_retry(fn, KAFKA_POLICY, classify, sleep=lambda s: None, should_stop=lambda: True)
    assert len(calls) == 1


def test_broken_classifier_means_non_retryable():
    def bad(exc):
        raise RuntimeError("oops")
    fn, calls = _flaky([RetryableSinkError("x")] * 5)
    with pytest.raises(RetryFailure) as ei:
        call_with_retry(fn, KAFKA_POLICY, bad, sleep=lambda s: None)
    assert len(calls) == 1 and ei.value.error_class is ErrorClass.NON_RETRYABLE
