# frozen_string_literal: true

require "test_helper"
require "open3"
require "rbconfig"

# Ruby 4.0 warns "IO::Buffer is experimental" at the first buffer of the process, which under a
# scheduler is the one Ruby makes for the io_read hook: evt keeps that warning back until the
# program makes a buffer of its own (lib/evt/buffer_warning.rb). Each case is a Ruby of its own
# (Ruby warns once per process), on this run's backend.
class BufferWarningTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)
  WARNING = "warning: IO::Buffer is experimental"
  READ = 'r, w = IO.pipe; Evt.run { Fiber.schedule { w.write("x") }; r.read(1) }'

  def run_ruby(script, *options)
    plain = { "RUBYOPT" => nil, "RUBYLIB" => nil, "BUNDLE_GEMFILE" => nil, "BUNDLER_SETUP" => nil }
    out, err, status = Open3.capture3(plain, RbConfig.ruby, *options, "-I#{LIB}", "-e", script)
    assert status.success?, err
    [out, err]
  end

  def test_reads_under_evt_print_no_buffer_warning
    out, err = run_ruby(%(require "evt"; #{READ}; #{READ}; print "read"))
    assert_equal "read", out
    refute_includes err, WARNING
  end

  # The warning comes at the program's own first buffer, pointing at its line, once.
  def test_the_programs_own_first_buffer_still_warns_once_at_its_line
    _, err = run_ruby(%(require "evt"; #{READ}\nIO::Buffer.new(4)\nIO::Buffer.for("x") { }\nIO::Buffer.new(2)))
    assert_equal 1, err.scan(WARNING).size, err
    assert_match(/\A-e:2: #{WARNING}/, err)
  end

  def test_a_buffer_made_before_evt_reads_warns_as_ruby_does
    _, err = run_ruby(%(IO::Buffer.new(1)\nrequire "evt"; #{READ}; IO::Buffer.new(2)))
    assert_equal 1, err.scan(WARNING).size, err
    assert_match(/\A-e:1: #{WARNING}/, err)
  end

  def test_no_experimental_warnings_means_none
    _, err = run_ruby(%(require "evt"; #{READ}; IO::Buffer.new(4)), "-W:no-experimental")
    refute_includes err, WARNING
  end

  # Another Ractor's buffers work, and (Ruby 4.0) leave the warning kept back to the main Ractor's
  # first buffer; before 4.0 nothing is kept back, and the Ractor's buffer warns as Ruby does.
  def test_a_buffer_in_another_ractor_works_and_the_warning_still_comes_once
    script = %(require "evt"; #{READ}; r = Ractor.new { IO::Buffer.new(4).size }\n) +
             %(print r.respond_to?(:value) ? r.value : r.take\nIO::Buffer.new(1))
    out, err = run_ruby(script)
    assert_equal "4", out
    assert_equal 1, err.scan(WARNING).size, err
    assert_match(/^-e:#{RUBY_VERSION >= "4.0" ? 3 : 1}: #{WARNING}/, err)
  end

  # A module prepended to Warning after evt, over a Warning.warn that takes the message alone.
  def test_a_warning_filter_prepended_after_evt_still_works
    out, err = run_ruby(<<~RUBY)
      require "evt"
      def Warning.warn(message) = $stdout.print("mine: ", message)
      Warning.singleton_class.prepend(Module.new { def warn(message, category: nil) = super(message) })
      Warning[:deprecated] = true
      warn "deprecated thing", category: :deprecated
    RUBY
    assert_empty err
    assert_equal "mine: deprecated thing\n", out
  end

  # A program's own Warning.warn that takes the message alone still gets every warning.
  def test_a_programs_warning_warn_without_category_still_gets_warnings
    out, err = run_ruby(<<~RUBY)
      require "evt"
      def Warning.warn(message) = $stdout.print("mine: ", message)
      Warning[:deprecated] = true
      warn "deprecated thing", category: :deprecated
      #{READ}
      IO::Buffer.new(4)
    RUBY
    assert_empty err
    assert_includes out, "mine: deprecated thing"
    assert_equal 1, out.scan(WARNING).size, out
  end
end
