"""The throughput benchmark end to end at a tiny size: every figure is in the JSON and the
counts are verified (no figure is asserted on), and its figures are computed right from
progress samples."""

from __future__ import annotations

import pytest

from benchmarks.throughput_report import crossing, figures, ratios

FIGURES = ("records_per_s_total", "records_per_s_steady", "cpu_us_per_record_steady",
           "cpu_us_per_record_total", "peak_rss_mib", "first_output_s",
           "records_per_s_after_first")


def test_steady_figures_come_from_interpolated_crossings() -> None:
    # 100 records: 0 at t=10, 50 at t=11 (CPU 1 s), 100 at t=12 (CPU 3 s).
    samples = [(0, 10.0, 0.0), (50, 11.0, 1.0), (100, 12.0, 3.0)]
    assert crossing(samples, 20) == pytest.approx((10.4, 0.4))
    assert crossing(samples, 90) == pytest.approx((11.8, 2.6))
    assert crossing(samples, 101) is None
    result = figures(samples, 100, started=9.0)
    assert result.records_per_s_steady == pytest.approx(70 / 1.4)
    assert result.cpu_us_per_record_steady == pytest.approx(2.2e6 / 70)
    assert result.records_per_s_total == pytest.approx(100 / 3)
    assert result.first_output_s == pytest.approx(1.02)
    assert result.records_per_s_after_first == pytest.approx(99 / 1.98)
    unfinished = figures(samples[:2], 100, started=9.0)
    assert unfinished.records_per_s_total is None and unfinished.records_per_s_steady is None


def test_ratios_take_the_best_denominator() -> None:
    results = [{"strategy": "relay-alo-1s", "records_per_s_steady": 30.0,
                "records_per_s_total": 10.0},
               {"strategy": "relay-eos-1s", "records_per_s_steady": 15.0,
                "records_per_s_total": None},
               {"strategy": "faust", "records_per_s_steady": 5.0, "records_per_s_total": 2.0},
               {"strategy": "quix", "records_per_s_steady": 20.0, "records_per_s_total": 1.0},
               {"strategy": "confluent-passthrough", "records_per_s_steady": 60.0,
                "records_per_s_total": 20.0}]
    by = {(r["numerator"], r["over"]): r
          for r in ratios(results, ("faust", "quix"), ("confluent-passthrough",))}
    peer = by[("relay-alo-1s", "best Python peer")]
    assert peer["records_per_s_steady"] == {"denominator": "quix", "ratio": 1.5}
    assert peer["records_per_s_total"] == {"denominator": "faust", "ratio": 5.0}
    assert by[("relay-alo-1s", "fastest passthrough")]["records_per_s_steady"]["ratio"] == 0.5
    eos = by[("relay-eos-1s", "Relay at-least-once")]
    assert eos["records_per_s_steady"]["ratio"] == 0.5
    assert eos["records_per_s_total"]["ratio"] is None


def test_relay_over_kafka_streams_at_its_commit_interval() -> None:
    results = [{"strategy": "relay-alo-1s", "records_per_s_steady": 30.0,
                "records_per_s_total": 10.0},
               {"strategy": "relay-alo-100ms", "records_per_s_steady": 20.0,
                "records_per_s_total": 8.0},
               {"strategy": "kafka-streams", "records_per_s_steady": 60.0,
                "records_per_s_total": None}]
    java = {"at_least_once": "kafka-streams", "exactly_once": "kafka-streams-eos"}
    lines = [r for r in ratios(results, (), (), java) if r["over"] == "Kafka Streams"]
    assert [r["numerator"] for r in lines] == ["relay-alo-1s"]
    assert lines[0]["records_per_s_steady"] == {"denominator": "kafka-streams", "ratio": 0.5}
    assert lines[0]["records_per_s_total"]["ratio"] is None
