# frozen_string_literal: true

require "test_helper"
require "open3"
require "rbconfig"

# evt where the C extension cannot be used: the pure-Ruby select backend, the fallback when the
# extension does not load, an install that needs no compiler; and many descriptors coming and going
# at once, which the poll backend keeps in one array.
class PortableTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  # A plain Ruby on +lib+ alone: without bundler's load path, which holds this checkout's lib/.
  def run_ruby(script, env: {}, lib: LIB)
    plain = {"EVT_BACKEND" => nil, "RUBYOPT" => nil, "RUBYLIB" => nil, "BUNDLE_GEMFILE" => nil, "BUNDLER_SETUP" => nil}
    Open3.capture3(plain.merge(env), RbConfig.ruby, "-I#{lib}", "-e", script)
  end

  def test_the_select_backend_is_always_available_and_last_but_for_an_emulated_one
    availables = Evt::Scheduler.availables
    emulated = availables.select { |name| Evt::Loop.emulation(name) }
    assert_equal :select, (availables - emulated).last
    assert_equal availables.last(emulated.size), emulated, "emulated backends come last"
  end

  def test_the_select_backend_has_the_whole_interface
    scheduler = Evt::Scheduler.new(backend: :select)
    assert_equal :select, scheduler.backend
    (Evt::HOOKS.keys - Evt::RUBY_LOOP_LEAVES + %i[run wakeup]).each do |hook|
      assert_respond_to scheduler, hook
    end
  ensure
    scheduler&.close
  end

  # With the extension, select is select(2) in the C loop; the pure-Ruby loop stays on request.
  def test_the_pure_ruby_loop_on_request
    scheduler = Evt::SelectScheduler.new
    assert_kind_of Evt::SelectLoop, scheduler
    assert_equal :select, scheduler.backend
    r, w = IO.pipe
    got = nil
    Thread.new do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule { got = r.read(2) }
      Fiber.schedule { w.write("ok") }
    end.join
    assert_equal "ok", got
  ensure
    r&.close
    w&.close
  end

  # The pure-Ruby loop (and its Process._fork and IO#close patches) costs nothing where it is not
  # used; its scheduler is a sibling of the C one, sharing the hooks written in Ruby.
  def test_the_pure_ruby_loop_is_loaded_only_when_used
    skip "without the extension the pure-Ruby loop is the loop" unless Evt.extension?
    out, err, status = run_ruby(<<~RUBY)
      require "evt"
      loaded = -> { $LOADED_FEATURES.grep(%r{evt/select_loop}).size }
      before = [loaded.call, Process.singleton_class.ancestors.map(&:to_s).grep(/Evt/)]
      Evt.run { sleep 0.001 }
      ran = loaded.call
      scheduler = Evt::SelectScheduler.new
      p [before, ran, loaded.call.positive?, scheduler.is_a?(Evt::Loop), scheduler.is_a?(Evt::Scheduling)]
    RUBY
    assert status.success?, err
    assert_equal "[[0, []], 0, true, false, true]\n", out
  end

  def test_evt_no_extension_runs_on_the_select_backend_without_a_warning
    out, err, status = run_ruby(<<~RUBY, env: {"EVT_NO_EXTENSION" => "1"})
      require "evt"
      p [Evt.extension?, Evt::Scheduler.availables, Evt.run { sleep 0.01; Fiber.scheduler.backend }]
    RUBY
    assert status.success?, err
    assert_equal "[false, [:select], :select]\n", out
    assert_empty err
  end

  # A lib/ without the built extension, as an install where it could not be built: one warning, then
  # the select backend.
  def test_without_the_built_extension_require_warns_once_and_falls_back_to_select
    Dir.mktmpdir do |dir|
      Dir.glob("**/*.rb", base: LIB).each do |path|
        FileUtils.mkdir_p(File.join(dir, File.dirname(path)))
        FileUtils.cp(File.join(LIB, path), File.join(dir, path))
      end
      out, err, status = run_ruby(<<~RUBY, lib: dir, env: {"EVT_NO_EXTENSION" => nil})
        require "evt"
        require "evt"
        r, w = IO.pipe
        p [Evt.extension?, Evt::Scheduler.availables, Evt.run { Fiber.schedule { w.write("ok") }; r.read(2) }]
      RUBY
      assert status.success?, err
      assert_equal "[false, [:select], \"ok\"]\n", out
      lines = err.lines
      assert_equal 1, lines.size, err
      assert_match(/evt: the C extension is not loaded \(it was not built when the gem was installed.*`gem pristine evt`.*\); using the pure-Ruby select backend/, lines.first)
    end
  end

  # A copy of lib/ (and, for a checkout, the Rakefile and ext/ beside it), without the build.
  def without_build(checkout: false)
    Dir.mktmpdir do |root|
      lib = File.join(root, "lib")
      Dir.glob("**/*.rb", base: LIB).each do |path|
        FileUtils.mkdir_p(File.join(lib, File.dirname(path)))
        FileUtils.cp(File.join(LIB, path), File.join(lib, path))
      end
      if checkout
        FileUtils.mkdir_p(File.join(root, "ext/evt"))
        FileUtils.cp(File.expand_path("../ext/evt/extconf.rb", __dir__), File.join(root, "ext/evt"))
        FileUtils.cp(File.expand_path("../Rakefile", __dir__), root)
      end
      yield root, lib
    end
  end

  # A Gemfile's path: compiles nothing: the warning names the command that builds the extension.
  def test_a_checkout_without_the_build_is_told_to_run_rake_compile
    without_build(checkout: true) do |root, lib|
      out, err, status = run_ruby('require "evt"; p Evt.extension?', lib: lib, env: {"EVT_NO_EXTENSION" => nil})
      assert status.success?, err
      assert_equal "false\n", out
      assert_includes err, "evt: the C extension is not loaded (it is not built in this checkout"
      assert_includes err, "run `bundle exec rake compile` in #{root}"
    end
  end

  # Strict mode: a broken install fails at require, saying why and what to run, instead of running
  # on the pure-Ruby loop.
  def test_evt_require_extension_raises_naming_why_and_what_to_run
    without_build(checkout: true) do |root, lib|
      script = <<~RUBY
        begin
          require "evt"
        rescue LoadError => e
          p [e.class, defined?(Evt::Scheduler)]
          puts e.message
        end
      RUBY
      out, err, status = run_ruby(script, lib: lib, env: {"EVT_NO_EXTENSION" => nil, "EVT_REQUIRE_EXTENSION" => "1"})
      assert status.success?, err
      first, message = out.lines
      assert_equal "[Evt::ExtensionMissing, nil]\n", first
      assert_match(/\Aevt: EVT_REQUIRE_EXTENSION=1, and the C extension is not loaded: it is not built in this checkout/, message)
      assert_includes message, "`bundle exec rake compile` in #{root}"
      refute_includes err, "pure-Ruby", "no fallback warning when the require fails"
    end
    _, err, status = run_ruby('require "evt"', env: {"EVT_NO_EXTENSION" => "1", "EVT_REQUIRE_EXTENSION" => "1"})
    refute status.success?
    assert_includes err, "EVT_REQUIRE_EXTENSION=1, and the C extension is not loaded: EVT_NO_EXTENSION=1 (Evt::ExtensionMissing)"
    skip "no extension to require" unless Evt.extension?
    out, err, status = run_ruby('require "evt"; p Evt.extension?', env: {"EVT_REQUIRE_EXTENSION" => "1"})
    assert status.success?, err
    assert_equal "true\n", out
  end

  # A build that is there but does not load (here: not a shared object at all) is named with the
  # loader's reason; a missing liburing gets what to install.
  def test_a_build_that_does_not_load_is_named_with_the_loaders_reason
    without_build do |_, lib|
      so = File.join(lib, "evt", RUBY_VERSION[/\A\d+\.\d+/], "evt.#{RbConfig::CONFIG["DLEXT"]}")
      FileUtils.mkdir_p(File.dirname(so))
      File.write(so, "not an object file")
      _, err, status = run_ruby('require "evt"; p Evt.extension?', lib: lib, env: {"EVT_NO_EXTENSION" => nil})
      assert status.success?, err
      assert_includes err, "evt: the C extension is not loaded (#{so} cannot be loaded: "
    end
    advice = Evt.send(:extension_advice, "liburing.so.2: cannot open shared object file: No such file or directory")
    assert_match(/install it, as Debian's and Ubuntu's liburing2 package, or use the precompiled gem/, advice)
    assert_equal "", Evt.send(:extension_advice, "invalid ELF header")
  end

  # gem install runs extconf.rb and make: with no working compiler both must still succeed.
  # The Ruby releases with a fiber-switching bug of their own get one warning at require "evt",
  # naming the bug and what to take instead (a child plays such a release by its RUBY_VERSION).
  def test_a_ruby_with_a_known_fiber_bug_is_named_once_at_require
    %w[3.4.10 4.0.4 4.0.5 4.0.6].each do |version|
      assert_match(/\Aevt: Ruby #{Regexp.escape(version)} has a use-after-free in fiber switching \(Ruby Bug #22196/,
                   Evt.ruby_warning(version))
    end
    # The advice is a later release: never one that lacks the security fixes of the series.
    assert_match(/use 4\.0\.7 or later/, Evt.ruby_warning("4.0.5"))
    assert_match(/use the next 3\.4 release \(3\.4\.11 or later\)/, Evt.ruby_warning("3.4.10"))
    Evt::RUBY_BUGS.each_key do |version|
      Evt.ruby_warning(version).scan(/\b(\d+\.\d+\.\d+)\b/).flatten.each do |named|
        next if named == version

        assert_operator Gem::Version.new(named), :>, Gem::Version.new(version), "#{version} advises #{named}"
      end
    end
    %w[3.3.8 3.4.5 3.4.9 4.0.0 4.0.3].each { |version| assert_nil Evt.ruby_warning(version), version }
    _, err, status = run_ruby(<<~RUBY)
      Object.send(:remove_const, :RUBY_VERSION)
      RUBY_VERSION = "4.0.5"
      require "evt"
      require "evt"
    RUBY
    assert status.success?, err
    assert_equal 1, err.lines.grep(/Bug #22196/).size, err
  end

  def test_the_extension_build_without_a_compiler_succeeds_and_installs_nothing
    extconf = File.expand_path("../ext/evt/extconf.rb", __dir__)
    Dir.mktmpdir do |dir|
      # mkmf runs the compiler RbConfig names through PATH: with an empty PATH, none works.
      out, status = Open3.capture2e({"PATH" => dir}, RbConfig.ruby, extconf, chdir: dir)
      assert status.success?, out
      assert_match(/no C compiler/, out)
      out, status = Open3.capture2e("make", chdir: dir)
      assert status.success?, out
      out, status = Open3.capture2e("make", "install", "sitearchdir=#{dir}/out", "sitelibdir=#{dir}/out", chdir: dir)
      assert status.success?, out
      assert_empty Dir.glob("#{dir}/**/*.{so,bundle,dll}")
    end
  end

  # Waiters on many descriptors, added and woken in an order unrelated to their numbers: each wakes
  # for its own descriptor only (the poll backend moves slots around as they leave).
  def test_many_descriptors_woken_in_shuffled_order
    pipes = Array.new(200) { IO.pipe }
    got = Array.new(pipes.size)
    order = (0...pipes.size).to_a.shuffle(random: Random.new(7))
    evt do
      order.each { |i| Fiber.schedule { got[i] = pipes[i][0].read(3) } }
      order.reverse_each do |i|
        pipes[i][1].write(format("%03d", i))
        sleep 0 if i.even? # some readers leave before the next writes arrive
      end
    end
    assert_equal Array.new(pipes.size) { |i| format("%03d", i) }, got
  ensure
    pipes&.flatten&.each(&:close)
  end
end
