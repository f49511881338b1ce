# frozen_string_literal: true

require "test_helper"
require "open3"
require "rbconfig"

# The README's Layout lists the C files bottom to top, each with the prefix of the names it defines.
# This holds the code to that list: over the objects this Ruby built (nm), every name a file
# defines carries its prefix, and every name of evt's it uses is defined in a file listed before
# it; every #include of evt's own headers names a file listed before (or the file's own header);
# and every file in ext/evt is listed.
class LayersTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  EXT = File.join(ROOT, "ext/evt")
  OBJECTS = File.join(ROOT, "tmp", RUBY_PLATFORM, "evt", RUBY_VERSION)

  # [[file stem, ["c", "h"], prefix or nil], ...] in the README's order.
  def layers
    @layers ||= begin
      block = File.read(File.join(ROOT, "README.md"))[/^## Layout\n+```\n(.*?)```/m, 1]
      flunk "the README has no Layout block" unless block
      block.scan(%r{^ext/evt/(\w+)\.(\{c,h\}|c|h)\s+(\S+)}).map do |stem, kinds, prefix|
        [stem, kinds == "{c,h}" ? %w[c h] : [kinds], prefix == "-" ? nil : prefix]
      end
    end
  end

  def position(stem) = layers.index { |name, _, _| name == stem }

  def test_every_file_is_listed_once_and_exists
    refute_empty layers
    assert_equal layers.map(&:first).uniq, layers.map(&:first), "a file is listed twice"
    listed = layers.flat_map { |stem, kinds, _| kinds.map { |k| "#{stem}.#{k}" } }.sort
    present = Dir.children(EXT).grep(/\.[ch]\z/).sort
    assert_equal present, listed, "the files in ext/evt and those the README's Layout lists differ"
  end

  # The README says the pure-Ruby loop's parts are named after their C counterparts.
  def test_the_pure_ruby_loops_files_are_named_after_c_files
    parts = Dir[File.join(ROOT, "lib/evt/select_loop/*.rb")].map { |f| File.basename(f, ".rb") }
    refute_empty parts
    parts.each do |part|
      assert position(part), "lib/evt/select_loop/#{part}.rb has no C counterpart in the README's Layout"
    end
  end

  def test_includes_run_down_only
    layers.each do |stem, kinds, _|
      kinds.each do |kind|
        File.read(File.join(EXT, "#{stem}.#{kind}")).scan(/^#include "(\w+)\.h"/).flatten.each do |header|
          below = position(header)
          refute_nil below, "#{stem}.#{kind} includes #{header}.h, which the Layout does not list"
          assert below <= position(stem), "#{stem}.#{kind} includes #{header}.h, listed after it"
        end
      end
    end
  end

  def test_names_and_calls_run_down_only
    skip "no objects of this Ruby's build at #{OBJECTS} (bundle exec rake compile makes them)" unless Dir.exist?(OBJECTS)
    objects = layers.select { |_, kinds, _| kinds.include?("c") }.map(&:first)
    defined = {}
    objects.each do |stem|
      path = File.join(OBJECTS, "#{stem}.o")
      assert File.exist?(path), "#{stem}.o was not built"
      nm(path, "--defined-only", "-g").each do |name|
        prefix = layers[position(stem)][2]
        assert name.start_with?(prefix), "#{stem}.c defines #{name}, without its prefix #{prefix}"
        defined[name] = stem
      end
    end
    objects.each do |stem|
      nm(File.join(OBJECTS, "#{stem}.o"), "-u").each do |name|
        owner = defined[name] or next # Ruby's, libc's, liburing's
        assert position(owner) < position(stem), "#{stem}.c uses #{name} of #{owner}.c, which is listed after it"
      end
    end
  end

  # backend.h: a backend reaches the core only through its reports (evt_waiter_fired,
  # evt_waiter_done) and the wakeup descriptor; it never looks up the core's registrations or timers.
  BACKEND_CALLS = %w[evt_waiter_fired evt_waiter_done evt_wakeup_drain].freeze

  def test_backends_reach_the_core_only_through_their_reports
    backends = layers.map(&:first).grep(/\Abackend_/)
    refute_empty backends
    backends.each do |stem|
      code = File.read(File.join(EXT, "#{stem}.c")).gsub(%r{/\*.*?\*/}m, "")
      %w[registrations timers evt_registration_ evt_loop_timer].each do |word|
        refute code.include?(word), "#{stem}.c reads the core's #{word}"
      end
      next unless Dir.exist?(OBJECTS)

      used = nm(File.join(OBJECTS, "#{stem}.o"), "-u").grep(/\Aevt_/)
      assert_empty used - BACKEND_CALLS, "#{stem}.c calls into the core beyond its reports"
    end
  end

  private

  def nm(path, *options)
    out, status = Open3.capture2("nm", *options, path)
    assert status.success?, "nm #{path} failed"
    out.lines.map { |line| line.split.last }
  end
end
