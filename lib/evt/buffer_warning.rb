# frozen_string_literal: true

module Evt
  # Ruby 4.0 warns "IO::Buffer is experimental" at the first IO::Buffer the process makes, whoever
  # makes it: under a scheduler that answers io_read/io_write (evt, as async), that is the buffer
  # Ruby makes for the hook at the program's first read, so every such program printed it, though
  # it never touched IO::Buffer. Ruby warns once per process, and not again after that first
  # buffer. So evt keeps back the warning of a buffer Ruby made for a hook, and gives it at the
  # program's own first IO::Buffer instead, as Ruby would have without a scheduler.
  #
  # A warning counts as a hook's when no IO::Buffer method is among its callers (the buffer was
  # made inside an IO method: IO#read, IO#write...). `-W:no-experimental` (Warning[:experimental]
  # = false) is respected throughout: Ruby then warns nothing, and evt gives nothing.
  # @api private
  module BufferWarning
    MESSAGE = "IO::Buffer is experimental"
    private_constant :MESSAGE

    # The warning kept back, until the program makes a buffer of its own.
    @withheld = nil

    class << self
      # @return [String, nil] the warning kept back, if any
      attr_reader :withheld

      # Whether Warning.warn's `message` is the buffer warning (and nothing was kept back yet).
      # @param message [String]
      # @param category [Symbol, nil]
      # @return [Boolean]
      def first?(message, category)
        category == :experimental && @withheld.nil? && message.include?(MESSAGE)
      end

      # Whether this is the main Ractor, whose state this module's is (other Ractors only read it).
      # @return [Boolean]
      def main_ractor? = Ractor.current.equal?(Ractor.main)

      # Whether that warning's buffer was made for a hook: no IO::Buffer method among its callers.
      # @param callers [Array<Thread::Backtrace::Location>] the warning's callers, innermost first
      # @return [Boolean]
      def hooks?(callers)
        callers.none? { |location| location.label.to_s.start_with?("IO::Buffer") }
      end

      # Keeps `message` back (the first time), and makes the program's own first buffer give it.
      # Outside the main Ractor nothing is kept (a module's state is the main Ractor's): the
      # warning is dropped there.
      # @param message [String]
      # @return [nil]
      def withhold(message)
        return unless main_ractor? && @withheld.nil?

        @withheld = message.sub(/\A.*?warning: /m, "").chomp.freeze # frozen: other Ractors read it
        IO::Buffer.singleton_class.prepend(GivenAtFirstBuffer)
        nil
      end

      # Gives the kept-back warning once, at the caller of the IO::Buffer constructor (in the main
      # Ractor: a buffer another Ractor makes leaves it for the main Ractor's first).
      # @return [nil]
      def give
        return unless main_ractor?

        message = @withheld or return
        @withheld = false # given: never again, as Ruby
        Kernel.warn(message, category: :experimental, uplevel: 2)
        nil
      end
    end

    # Prepended to Warning's singleton class: Warning.warn, filtering the hooks' buffer warning.
    module Filter
      # @see Warning.warn
      def warn(message, category: nil, **options)
        # Ruby gives the warning once: after that first one, it is evt's own (BufferWarning.give).
        if BufferWarning.first?(message, category) && BufferWarning.hooks?(caller_locations(1, 8) || [])
          return BufferWarning.withhold(message)
        end

        # Ruby passes category: because this method takes it; the Warning.warn below this one (a
        # program's own) may take the message alone.
        below = method(:warn)
        below = below.super_method until below.nil? || below.owner == Filter
        return super(message) if below&.super_method&.arity == 1

        super
      end
    end

    # Prepended to IO::Buffer's singleton class once a warning is kept back: the constructors a
    # program makes a buffer with give it.
    module GivenAtFirstBuffer
      # @see IO::Buffer.new
      def new(...)
        BufferWarning.give if BufferWarning.withheld
        super
      end

      # @see IO::Buffer.for
      def for(...)
        BufferWarning.give if BufferWarning.withheld
        super
      end

      # @see IO::Buffer.map
      def map(...)
        BufferWarning.give if BufferWarning.withheld
        super
      end

      # @see IO::Buffer.string
      def string(...)
        BufferWarning.give if BufferWarning.withheld
        super
      end
    end
  end
end

# Ruby makes a buffer for a hook only from 4.0 on (before, only IO::Buffer.new warns).
Warning.singleton_class.prepend(Evt::BufferWarning::Filter) if RUBY_VERSION >= "4.0"
