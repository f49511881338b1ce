# frozen_string_literal: true

require "test_helper"
require "open3"
require "rbconfig"

# ext/evt/LAYERS lists the C files bottom to top, each with the prefix of the names it defines; the
# docs/development.md's Layout quotes it. This holds the code to it, rule by rule. Each rule is a function of the
# tree (the sources, the objects' symbols) that returns what breaks it: run on the tree as it is, it
# must find nothing; run on a copy broken on purpose, it must find that.
#
# - every C file is listed once, and every listed file exists;
# - #include of evt's own headers runs down: a file includes only headers listed before it (or its
#   own); a backend includes backend.h alone, which declares no core structure, so the compiler
#   keeps a backend to what backend.h shows of the loop (struct evt_kernel and struct evt_watch);
# - the names a file defines (nm, over the objects bin/test built: missing objects fail) carry its
#   prefix, and every name of evt's it uses is defined in a file listed before it; a backend uses
#   only its reports and the wakeup;
# - the inline helpers of a header carry its prefix and call only names of files at or below it;
# - no file calls into a file above it through Ruby's method dispatch: it names (rb_intern) no method
#   that a file above defines, nor one of Evt::Scheduling's, unless Ruby's own classes define it too.
class LayersTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  EXT = File.join(ROOT, "ext/evt")
  OBJECTS = File.join(ROOT, "tmp", RUBY_PLATFORM, "evt", RUBY_VERSION)
  # What a backend may call of evt's: its reports and the wakeup descriptor.
  BACKEND_CALLS = %w[evt_waiter_fired evt_waiter_done evt_wakeup_drain].freeze
  # Classes whose methods a C file may call on any object (a stand-in for a fiber answers Fiber's).
  RUBY_CLASSES = [BasicObject, Object, Kernel, Module, Class, Fiber, Thread, IO, Array, Hash, Exception].freeze

  Layer = Struct.new(:stem, :files, :prefix)

  # The rules, each a function of the parts of a tree, returning a message per thing that breaks it.
  module Rules
    module_function

    # LAYERS' lines as Layers, in order.
    def layers(text)
      text.lines.grep_v(/\A\s*(#|$)/).map do |line|
        match = line.match(/\A(\w+)\.(\{c,h\}|c|h)\s+(\S+)/) or raise "a line of LAYERS reads: #{line}"
        stem, kinds, prefix = match.captures
        Layer.new(stem, (kinds == "{c,h}" ? %w[c h] : [kinds]).map { |kind| "#{stem}.#{kind}" }, prefix)
      end
    end

    def position(layers, file) = layers.index { |layer| layer.files.include?(file) || layer.stem == File.basename(file, ".*") }

    # The layer whose prefix an evt name carries (the longest that fits).
    def owner(layers, name) = layers.select { |layer| name.start_with?(layer.prefix) }.max_by { |layer| layer.prefix.size }

    def listing(layers, present)
      listed = layers.flat_map(&:files)
      (listed - present).map { |file| "#{file} is listed, and is not in ext/evt" } +
        (present - listed).map { |file| "#{file} is in ext/evt, and LAYERS does not list it" } +
        listed.tally.select { |_, n| n > 1 }.map { |file, _| "#{file} is listed twice" }
    end

    # sources: file name => text.
    def includes(layers, sources)
      sources.flat_map do |file, text|
        here = position(layers, file)
        text.scan(/^#include "([\w.]+)"/).flatten.filter_map do |header|
          below = position(layers, header)
          if below.nil? then "#{file} includes #{header}, which LAYERS does not list"
          elsif below > here then "#{file} includes #{header}, listed after it"
          elsif file.start_with?("backend_") && header != "backend.h"
            "#{file} includes #{header}: a backend includes backend.h alone"
          end
        end
      end
    end

    # backend.h declares nothing of the core's: what a backend sees of the loop is what it defines.
    def backend_header(text)
      code = text.gsub(%r{/\*.*?\*/}m, "")
      %w[evt_loop evt_registration evt_wait evt_timers].filter_map do |type|
        "backend.h names struct #{type}, the core's" if code.match?(/struct\s+#{type}\b/)
      end
    end

    # The static inline functions a header defines, with their bodies.
    def inline_helpers(text)
      text.scan(/^static inline\b[^(;]*?\b(\w+)\(([^)]*)\)\s*\{(.*?)^\}/m).map { |name, _, body| [name, body] }
    end

    def helpers(layers, sources)
      sources.select { |file, _| file.end_with?(".h") }.flat_map do |file, text|
        layer = layers[position(layers, file)]
        inline_helpers(text).flat_map do |name, body|
          problems = []
          problems << "#{file} defines the inline #{name}, without its prefix #{layer.prefix}" unless name.start_with?(layer.prefix)
          body.scan(/\b(evt_\w+)\s*\(/).flatten.uniq.each do |called|
            callee = owner(layers, called)
            if callee && layers.index(callee) > layers.index(layer)
              problems << "#{file}'s inline #{name} calls #{called} of #{callee.stem}, listed after it"
            end
          end
          problems
        end
      end
    end

    # The methods each file defines for Ruby (rb_define_method and friends).
    def methods_defined(text) = text.scan(/rb_define_\w*method\w*\([^,]+,\s*"([^"]+)"/).flatten

    def dispatch(layers, sources, above_all)
      defined = sources.to_h { |file, text| [file, methods_defined(text)] }
      sources.flat_map do |file, text|
        here = position(layers, file)
        text.scan(/rb_intern\("([^"]+)"\)/).flatten.uniq.filter_map do |name|
          next if RUBY_CLASSES.any? { |klass| klass.method_defined?(name) || klass.private_method_defined?(name) }

          higher = defined.select { |other, names| names.include?(name) && position(layers, other) > here }.keys
          higher << "Evt::Scheduling" if above_all.include?(name.to_sym)
          "#{file} calls #{name} through Ruby's dispatch, which #{higher.join(" and ")} defines above it" unless higher.empty?
        end
      end
    end

    # nm: file => [names it defines, evt names it uses].
    def symbols(layers, nm)
      owners = {}
      problems = []
      nm.each do |file, (defined, _)|
        layer = layers[position(layers, file)]
        defined.each do |name|
          problems << "#{file} defines #{name}, without its prefix #{layer.prefix}" unless name.start_with?(layer.prefix)
          owners[name] = file
        end
      end
      nm.each do |file, (_, used)|
        used.each do |name|
          owner = owners[name] or next # Ruby's, libc's, liburing's
          if position(layers, owner) >= position(layers, file)
            problems << "#{file} uses #{name} of #{owner}, which is not listed before it"
          elsif file.start_with?("backend_") && !BACKEND_CALLS.include?(name)
            problems << "#{file} calls #{name}: a backend calls into the core only through its reports and the wakeup"
          end
        end
      end
      problems
    end
  end

  def layers = @layers ||= Rules.layers(File.read(File.join(EXT, "LAYERS")))

  def sources
    @sources ||= Dir.children(EXT).grep(/\.[ch]\z/).sort.to_h { |file| [file, File.read(File.join(EXT, file))] }
  end

  # The objects this Ruby's build made (bin/test compiles before it runs the tests), as Rules.symbols takes them.
  def nm_table
    assert Dir.exist?(OBJECTS), "no objects of this Ruby's build at #{OBJECTS}: bin/test (bundle exec rake compile) makes them"
    layers.flat_map(&:files).grep(/\.c\z/).to_h do |file|
      object = File.join(OBJECTS, file.sub(/\.c\z/, ".o"))
      assert File.exist?(object), "#{File.basename(object)} was not built"
      [file, [nm(object, "--defined-only", "-g"), nm(object, "-u").grep(/\Aevt_/)]]
    end
  end

  def nm(path, *options)
    out, status = Open3.capture2("nm", *options, path)
    assert status.success?, "nm #{path} failed"
    out.lines.map { |line| line.split.last }
  end

  def above_all = Evt::Scheduling.instance_methods(false) + Evt::Scheduling.private_instance_methods(false)

  # A copy of the sources with `file` changed by the block.
  def broken(file)
    sources.merge(file => yield(sources.fetch(file).dup))
  end

  def test_every_file_is_listed_once_and_exists
    assert_empty Rules.listing(layers, sources.keys)
    refute_empty Rules.listing(layers, sources.keys + ["extra.c"])
    refute_empty Rules.listing(layers + [layers.first], sources.keys)
  end

  def test_the_development_page_quotes_the_order
    block = File.read(File.join(ROOT, "docs/development.md"))[/^## Layout\n+```\n(.*?)```/m, 1]
    refute_nil block, "docs/development.md has no Layout block"
    quoted = block.lines.grep(%r{\Aext/evt/\S+\.(\{c,h\}|c|h)\s}).map { |line| line.delete_prefix("ext/evt/").rstrip }
    assert_equal File.read(File.join(EXT, "LAYERS")).lines.map(&:rstrip).grep_v(/\A(#|$)/), quoted,
                 "docs/development.md's Layout does not quote ext/evt/LAYERS line for line"
  end

  # Every path the Layout names exists (its first column).
  def test_the_layout_names_paths_that_exist
    block = File.read(File.join(ROOT, "docs/development.md"))[/^## Layout\n+```\n(.*?)```/m, 1]
    paths = block.lines.filter_map { |line| line[%r{\A([a-z][\w./{},-]*)\s}, 1] }
    refute_empty paths
    missing = paths.flat_map { |path| path.include?("{") ? %w[c h].map { |ext| path.sub("{c,h}", ext) } : [path] }
                   .reject { |path| File.exist?(File.join(ROOT, path)) || Dir.glob(File.join(ROOT, path)).any? }
    assert_empty missing, "docs/development.md's Layout names what the tree does not have"
  end

  def test_includes_run_down_and_backends_include_backend_h_alone
    assert_empty Rules.includes(layers, sources)
    assert_empty Rules.backend_header(sources.fetch("backend.h"))
    up = broken("close.c") { |text| text.sub('#include "close.h"', "#include \"close.h\"\n#include \"hooks.h\"") }
    assert_equal ["close.c includes hooks.h, listed after it"], Rules.includes(layers, up)
    core = broken("backend_epoll.c") { |text| text.sub('#include "backend.h"', "#include \"backend.h\"\n#include \"wakeup.h\"") }
    assert_equal ["backend_epoll.c includes wakeup.h: a backend includes backend.h alone"], Rules.includes(layers, core)
    refute_empty Rules.backend_header(sources.fetch("backend.h") + "\nstruct evt_loop;\n")
  end

  def test_inline_helpers_carry_their_prefix_and_call_down
    assert_empty Rules.helpers(layers, sources)
    named = broken("core.h") { |text| text.sub("#endif", "static inline int\nevt_loop_due(void)\n{\n    return 0;\n}\n\n#endif") }
    assert_equal ["core.h defines the inline evt_loop_due, without its prefix evt_core_"], Rules.helpers(layers, named)
    up = broken("registration.h") do |text|
      text.sub("#endif", "static inline void\nevt_registration_run(struct evt_loop *l)\n{\n    evt_loop_run(l, 0);\n}\n\n#endif")
    end
    assert_equal ["registration.h's inline evt_registration_run calls evt_loop_run of loop, listed after it"],
                 Rules.helpers(layers, up)
  end

  def test_no_call_runs_up_through_rubys_dispatch
    assert_empty Rules.dispatch(layers, sources, above_all)
    up = broken("close.c") { |text| text + "\nstatic ID id_sleep_;\nstatic void f(void) { id_sleep_ = rb_intern(\"kernel_sleep\"); }\n" }
    assert_equal ["close.c calls kernel_sleep through Ruby's dispatch, which hooks.c defines above it"],
                 Rules.dispatch(layers, up, above_all)
    ruby = broken("io.c") { |text| text + "\nstatic void g(void) { rb_intern(\"blocking_operation_wait\"); }\n" }
    assert_equal ["io.c calls blocking_operation_wait through Ruby's dispatch, which Evt::Scheduling defines above it"],
                 Rules.dispatch(layers, ruby, above_all)
  end

  def test_names_and_calls_run_down_only
    table = nm_table
    assert_empty Rules.symbols(layers, table)
    up = table.merge("close.c" => [table["close.c"][0], table["close.c"][1] + ["evt_wait_suspend"]])
    assert_equal ["close.c uses evt_wait_suspend of wait.c, which is not listed before it"], Rules.symbols(layers, up)
    backend = table.merge("backend_poll.c" => [table["backend_poll.c"][0], table["backend_poll.c"][1] + ["evt_registration_get"]])
    assert_equal ["backend_poll.c calls evt_registration_get: a backend calls into the core only through its reports and the wakeup"],
                 Rules.symbols(layers, backend)
    unprefixed = table.merge("object.c" => [table["object.c"][0] + ["loop_registry"], table["object.c"][1]])
    assert_equal ["object.c defines loop_registry, without its prefix evt_object_"], Rules.symbols(layers, unprefixed)
  end
end
