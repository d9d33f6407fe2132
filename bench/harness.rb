# frozen_string_literal: true

# The one way Herald benchmarks measure and report: each measurement runs its block for several rounds,
# keeps the median rate and the objects allocated per operation, and prints a Markdown table with every
# row's ratio to the section's baseline (a peer measured in the same run).
#
#   Bench.section("Publish", note: "...") do |s|
#     s.measure("message_bus memory", ops: 20_000, baseline: true) { |n| n.times { MessageBus.publish(...) } }
#     s.measure("Herald Log", ops: 20_000) { |n| n.times { bus.publish(...) } }
#   end
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)

module Bench
  ROUNDS = Integer(ENV.fetch("BENCH_ROUNDS", "5"))
  SCALE = Float(ENV.fetch("BENCH_SCALE", "1")) # BENCH_SCALE=0.1 for a quick smoke run

  def self.median(values)
    sorted = values.sort
    mid = sorted.size / 2
    sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0
  end

  def self.section(title, note: nil)
    section = Section.new(title, note)
    yield section
    puts section.to_markdown
    $stdout.flush
  end

  Row = Struct.new(:name, :rate, :allocs, :baseline, :unit, :extra)

  class Section
    def initialize(title, note)
      @title = title
      @note = note
      @rows = []
    end

    # The block gets the op count and runs that many operations. Returns the row.
    def measure(name, ops:, baseline: false, rounds: ROUNDS, warmup: true, unit: "ops/s")
      ops = [(ops * SCALE).to_i, 1].max
      yield [ops / 10, 1].max if warmup
      rates = []
      allocs = []
      rounds.times do
        GC.start
        before = GC.stat(:total_allocated_objects)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        yield ops
        elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
        allocs << (GC.stat(:total_allocated_objects) - before).fdiv(ops)
        rates << ops / elapsed
      end
      add(name, Bench.median(rates), Bench.median(allocs), baseline: baseline, unit: unit)
    end

    # For figures measured elsewhere (latency percentiles, RSS, wrk output): rate is "higher is better".
    def add(name, rate, allocs = nil, baseline: false, unit: "ops/s", extra: nil)
      Row.new(name, rate, allocs, baseline, unit, extra).tap { |r| @rows << r }
    end

    def to_markdown
      base = @rows.find(&:baseline)
      lines = ["### #{@title}", ""]
      lines << @note << "" if @note
      lines << "| | median | vs #{base ? base.name : "baseline"} | objects/op |" << "|---|---:|---:|---:|"
      @rows.each do |r|
        ratio = base ? format("%.2fx", r.rate / base.rate) : "-"
        allocs = r.allocs ? format("%.1f", r.allocs) : "-"
        lines << "| #{r.name}#{" (baseline)" if r.baseline} | #{Bench.humanize(r.rate)} #{r.unit} | #{ratio} | #{allocs} |"
      end
      lines.join("\n") + "\n\n"
    end
  end

  def self.humanize(value)
    return format("%.1f", value) if value < 1000
    value.round.to_s.reverse.scan(/\d{1,3}/).join(",").reverse
  end
end
