"""tests/exporter/helmrender.py behaves as Go's text/template and Sprig document it, for the subset
NVIDIA's chart uses, and refuses everything else instead of rendering it differently."""

from __future__ import annotations

from typing import Any

import pytest

from tests.exporter.helmrender import Renderer, TemplateError, coalesce

CTX = {"Values": {"name": "gpu", "port": 9400.0, "on": True, "off": False, "empty": "", "list": ["a", "b"],
                  "map": {"k": "v"}, "none": None},
       "Release": {"Name": "dcgm-exporter"}}


def render(src: str, ctx: Any = None) -> str:
    r = Renderer()
    return r.run(r.load(src), CTX if ctx is None else ctx)


@pytest.mark.parametrize(
    ("src", "out"),
    [
        ("a  {{- .Values.name }}", "agpu"),  # {{- trims the spaces and newlines before it
        ("{{ .Values.name -}}\n  b", "gpub"),  # -}} trims after it
        ("x:\n  {{- if .Values.on }}\n  y{{- end }}", "x:\n  y"),
        ("{{ .Values.port }}", "9400"),  # a YAML number prints as helm prints it
        ("{{ .Values.on }}/{{ .Values.off }}", "true/false"),
        ("[{{ .Values.missing }}]", "[]"),  # a missing value is empty in helm's output
        ("{{/* a comment */}}z", "z"),
        ("{{ if .Values.empty }}1{{ else }}2{{ end }}", "2"),
        ("{{ if .Values.list }}1{{ else }}2{{ end }}", "1"),
        ("{{ with .Values.map }}{{ .k }}{{ else }}none{{ end }}", "v"),
        ("{{ with .Values.none }}x{{ else }}none{{ end }}", "none"),
        ("{{ range .Values.list }}-{{ . }}{{ end }}", "-a-b"),
        ("{{ range $.Values.list }}{{ $.Release.Name }}{{ end }}", "dcgm-exporterdcgm-exporter"),
        ('{{ $n := default "chart" .Values.empty }}{{ $n }}', "chart"),
        ('{{ default "chart" .Values.name }}', "gpu"),
        ('{{ printf "%s-%s" .Release.Name "x" | trunc 15 | trimSuffix "-" }}', "dcgm-exporter-x"),
        ('{{ printf "%s-%s" "abcdefghijklmn" "x" | trunc 15 | trimSuffix "-" }}', "abcdefghijklmn"),
        ('{{ if contains "dcgm" .Release.Name }}yes{{ end }}', "yes"),
        ('{{ ternary "HTTPS" "HTTP" .Values.off }}', "HTTP"),
        ("{{ or .Values.off .Values.empty }}|{{ and .Values.on .Values.name }}", "|gpu"),
        ("{{ if not .Values.off }}n{{ end }}", "n"),
        ('{{ .Values.list | join "," | quote }}', '"a,b"'),
        ("m:{{- toYaml .Values.map | nindent 2 }}", "m:\n  k: v"),
        ('{{ "1.2+3" | replace "+" "_" }}', "1.2_3"),
        ('{{ (printf "%s-tls" .Values.name) }}', "gpu-tls"),
    ],
)
def test_go_template_semantics(src: str, out: str) -> None:
    assert render(src) == out


def test_define_and_include_run_with_the_passed_context() -> None:
    r = Renderer()
    r.load('{{- define "n" -}}{{ .Release.Name }}-{{ .Values.name }}{{- end -}}')
    assert r.run(r.load('name: {{ include "n" . }}'), CTX) == "name: dcgm-exporter-gpu"


@pytest.mark.parametrize(
    "src",
    [
        "{{ lower .Values.name }}",  # a function outside the subset
        "{{ template \"x\" . }}",
        "{{ if .Values.on }}unclosed",
        "{{ end }}",
        "{{ range .Values.list }}{{ else }}{{ end }}",
        "{{ (default \"a\" .Values.name }}",
        "{{ .Values.map }}",  # printing a map is Go's map[...] syntax, never what a chart wants
    ],
)
def test_anything_outside_the_subset_is_refused(src: str) -> None:
    with pytest.raises(TemplateError):
        render(src)


@pytest.mark.parametrize(
    ("defaults", "overrides", "out"),
    [
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": 3}}, {"a": {"b": 3, "c": 2}}),  # maps merge key by key
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),  # lists replace
        ({"a": {"b": 1}, "d": 4}, {"a": None}, {"d": 4}),  # null deletes the default
        ({"a": 1}, {"e": {"f": 1}}, {"a": 1, "e": {"f": 1}}),
    ],
)
def test_coalesce_merges_values_as_helm_does(defaults: Any, overrides: Any, out: Any) -> None:
    assert coalesce(defaults, overrides) == out
