//! Workload generator, presets, latency histograms and fio-style reports
