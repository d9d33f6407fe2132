# frozen_string_literal: true

# The one way Herald benchmarks measure and report. A section's `measure` rows are run round-robin after the
# section's block returns: one round of every row, then the next round, so a change in the machine's load
# (2 shared cores) hits every row alike instead of the rows measured last. Each row keeps every round's
# rate; the table prints the median, the spread (min-max over rounds), the ratio of medians to the
# section's baseline (a peer measured in the same rounds) and the objects allocated per operation.
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

  def self.loadavg = File.read("/proc/loadavg").split.first(3).join(" ")

  def self.section(title, note: nil)
    section = Section.new(title, note)
    yield section
    section.run
    puts section.to_markdown
    $stdout.flush
  end

  # samples: every round's rate (nil for a figure measured once); allocs: objects per operation.
  # failure: why the row stopped (a peer that raised, e.g. message_bus's PostgreSQL backend deadlocking
  # under concurrent publishes); the row is reported as failed and the section goes on.
  Row = Struct.new(:name, :rate, :allocs, :baseline, :unit, :extra, :samples, :failure)
  Job = Struct.new(:row, :ops, :rounds, :warmup, :block, :rates, :allocs)

  class Section
    def initialize(title, note)
      @title = title
      @note = note
      @rows = []
      @jobs = []
    end

    # Registers a row; the block gets the op count and runs that many operations. The rounds run in
    # Section#run, interleaved with the section's other rows. Returns the row (filled in by #run).
    def measure(name, ops:, baseline: false, rounds: ROUNDS, warmup: true, unit: "ops/s", &block)
      row = add(name, nil, baseline: baseline, unit: unit)
      @jobs << Job.new(row, [(ops * SCALE).to_i, 1].max, rounds, warmup, block, [], [])
      row
    end

    # Every row's warm-up, then round r of every row that has that many rounds, then round r + 1.
    def run
      return if @jobs.empty? # rows measured elsewhere (wrk, latency) say their own load
      @load_before = Bench.loadavg
      @jobs.each { |job| warm_up(job) if job.warmup }
      (@jobs.map(&:rounds).max || 0).times do |round|
        @jobs.each { |job| measure_round(job) if round < job.rounds && !job.row.failure }
      end
      @jobs.each do |job|
        next if job.row.failure
        job.row.rate = Bench.median(job.rates)
        job.row.allocs = Bench.median(job.allocs)
        job.row.samples = job.rates
      end
      @load_after = Bench.loadavg
    end

    # For figures measured elsewhere (latency percentiles, RSS, wrk output): rate is "higher is better";
    # samples are the individual measurements the rate is the median of.
    def add(name, rate, allocs = nil, baseline: false, unit: "ops/s", extra: nil, samples: nil)
      Row.new(name, rate, allocs, baseline, unit, extra, samples).tap { |r| @rows << r }
    end

    def to_markdown
      base = @rows.find(&:baseline)
      lines = ["### #{@title}", ""]
      lines << @note << "" if @note
      lines << "Load average #{@load_before} before, #{@load_after} after (2 cores shared with other work)." << "" if @load_before
      lines << "| | median | spread (min-max) | vs #{base ? base.name : "baseline"} | objects/op |" << "|---|---:|---:|---:|---:|"
      @rows.each do |r|
        next lines << "| #{r.name} | failed: #{r.failure} | - | - | - |" if r.failure
        ratio = (base&.rate && r.rate) ? format("%.2fx", r.rate / base.rate) : "-"
        allocs = r.allocs ? format("%.1f", r.allocs) : "-"
        spread = r.samples&.any? ? "#{Bench.humanize(r.samples.min)}-#{Bench.humanize(r.samples.max)}" : "-"
        lines << "| #{r.name}#{" (baseline)" if r.baseline} | #{Bench.humanize(r.rate)} #{r.unit}#{"; #{r.extra}" if r.extra} | #{spread} | #{ratio} | #{allocs} |"
      end
      lines.join("\n") + "\n\n"
    end

    private

    def warm_up(job)
      job.block.call([job.ops / 10, 1].max)
    rescue => e
      failed(job, e)
    end

    def measure_round(job)
      GC.start
      timed(job)
    rescue => e
      failed(job, e)
    end

    def failed(job, error)
      job.row.failure = "#{error.class}: #{error.message.lines.first.to_s.strip} (after #{job.rates.size} rounds)"
      warn "bench: #{job.row.name} failed: #{job.row.failure}"
    end

    def timed(job)
      before = GC.stat(:total_allocated_objects)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      job.block.call(job.ops)
      elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      job.allocs << (GC.stat(:total_allocated_objects) - before).fdiv(job.ops)
      job.rates << job.ops / elapsed
    end
  end

  def self.humanize(value)
    return format("%.1f", value) if value < 1000
    value.round.to_s.reverse.scan(/\d{1,3}/).join(",").reverse
  end
end
