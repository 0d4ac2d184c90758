"""Joch's Events in the core v1 and events.k8s.io/v1 shapes, and the field selectors describe sends."""

from __future__ import annotations

import pytest

from joch.api import errors, events
from joch.server import events_view

RUN = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
       "metadata": {"name": "r", "namespace": "default", "uid": "u-1"}}
EVENT = {**events.event(RUN, reason="Started", message="go", type="Warning"),
         "metadata": {"name": "r.1", "namespace": "default", "uid": "e-1", "resourceVersion": "5"}}


def test_the_core_shape_has_the_fields_kubectl_describe_prints() -> None:
    core = events_view.to_core(EVENT)
    assert (core["apiVersion"], core["kind"]) == ("v1", "Event")
    assert core["involvedObject"] == {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "name": "r",
                                      "namespace": "default", "uid": "u-1"}
    assert (core["type"], core["reason"], core["message"], core["count"]) == ("Warning", "Started", "go", 1)
    assert core["source"] == {"component": "joch-controller-manager"} and core["lastTimestamp"]


def test_the_events_k8s_io_shape() -> None:
    new = events_view.to_events_v1(EVENT)
    assert new["apiVersion"] == "events.k8s.io/v1" and new["regarding"]["name"] == "r" and new["note"] == "go"
    assert new["eventTime"].endswith(".000000Z") and new["reportingController"] == "joch-controller-manager"
    assert "series" not in new


def test_field_selectors_as_describe_sends_them() -> None:
    selector = ("involvedObject.name=r,involvedObject.namespace=default,involvedObject.kind=AgentRun,"
                "involvedObject.uid=u-1")
    keep = events_view.selected(events_view.parse_fields(selector))
    assert keep(EVENT)
    assert not events_view.selected(events_view.parse_fields("involvedObject.name=other"))(EVENT)
    others = events_view.parse_fields("type!=Normal,reason==Started,source=joch-controller-manager")
    assert events_view.selected(others)(EVENT)


def test_an_unsupported_field_is_a_400_naming_the_supported_ones() -> None:
    with pytest.raises(errors.BadRequest) as caught:
        events_view.parse_fields("spec.reason=x")
    assert 'field label not supported: "spec.reason"' in caught.value.message
    assert "involvedObject.uid" in caught.value.message
